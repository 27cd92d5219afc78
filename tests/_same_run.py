"""Two runs the same to the bit: the check that tests of warm ranks, rank servers and emulated CPUs share.

A helper module, not a test file: test files in every folder of ``tests/`` import it by name (``tests/`` is on
``sys.path``, as the conftest's folder).
"""

import pandas as pd

import commhooks_lab as lab

#: Read from the clock (step_time_s) and from the OS's count of bytes the rank wrote (wire_bytes: equal
#: here run after run, but nothing promises that gloo splits its socket writes the same way; test_payload
#: bounds it). Everything else a run reports must match bit for bit.
VOLATILE = ["step_time_s", "wire_bytes"]


def fingerprint(result: lab.Result) -> dict:
    """Everything a run measured, except what the clock measures."""
    return {
        "steps": result.steps.drop(columns=VOLATILE, errors="ignore"),
        "layers": result.layers.drop(columns=VOLATILE, errors="ignore"),
        "notes": result.notes,
        "final": result.final,
        "sample": result.sample,
        "config": result.config,
    }


def assert_same_run(a: lab.Result, b: lab.Result) -> None:
    fa, fb = fingerprint(a), fingerprint(b)
    pd.testing.assert_frame_equal(fa.pop("steps"), fb.pop("steps"), check_exact=True)
    pd.testing.assert_frame_equal(fa.pop("layers"), fb.pop("layers"), check_exact=True)
    sample_a, sample_b = fa.pop("sample"), fb.pop("sample")
    assert (sample_a is None) == (sample_b is None)
    if sample_a is not None:
        assert sample_a.keys() == sample_b.keys()
        for key in sample_a:
            assert repr(sample_a[key]) == repr(sample_b[key]), key
    assert fa == fb
