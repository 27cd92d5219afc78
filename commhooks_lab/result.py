"""What a run hands back: tidy tables (per step, per step x layer), notes, config, environment.

Saved as JSON, never pickle: a result file is data anyone can open, and loading one runs no code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["from_ranks", "load", "Result", "ResultSet", "VERSION"]

FORMAT = "commhooks_lab.Result"
#: How the summary columns are shown: enough digits to compare hooks, few enough to stay stable.
SUMMARY_FORMATS = {
    "rel_error": "{:.2e}",
    "cosine": "{:.4f}",
    "rank_spread": "{:.1e}",
    "payload_vs_fp32": "{:.4f}",
    "final_loss": "{:.4f}",
    "accuracy": "{:.3f}",
    "step_ms": "{:.3g}",
}
VERSION = 1


def _frame_to_json(df: pd.DataFrame) -> dict:
    return {
        "columns": list(df.columns),
        "dtypes": {c: str(t) for c, t in df.dtypes.items()},
        "data": df.astype(object).where(df.notna(), None).values.tolist(),
    }


def _frame_from_json(data: dict) -> pd.DataFrame:
    df = pd.DataFrame(data["data"], columns=data["columns"])
    return df.astype(data["dtypes"])


@dataclass
class Result:
    """One run. ``steps``: a row per step; ``layers``: a row per step and parameter."""

    config: dict
    steps: pd.DataFrame
    layers: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    env: dict = field(default_factory=dict)
    final: dict = field(default_factory=dict)
    sample: dict | None = None  # one layer's hook and exact gradient at the last step

    @property
    def name(self) -> str:
        return self.config.get("name") or str(self.config.get("hook"))

    @property
    def ranks_agree(self) -> bool:
        """Did every rank end with bit-identical parameters (DDP's invariant)?"""
        return len(set(self.final.get("param_digests", []))) == 1

    def compressed_steps(self) -> pd.DataFrame:
        """The steps where the hook compressed, or all steps if it never did."""
        compressed = self.steps[self.steps["compressing"]] if "compressing" in self.steps else self.steps
        return compressed if len(compressed) else self.steps

    def step_ms(self, skip: int = 1, compressed: bool = False) -> dict:
        """Rank 0's step time in ms over the steps after the first ``skip`` (DDP builds its buckets in the
        first), of those only the ones where the hook compressed if ``compressed`` (and it ever did): median,
        min and max, and how many steps they come from."""
        steps = self.steps.iloc[skip:]
        if compressed and "compressing" in steps and steps["compressing"].any():
            steps = steps[steps["compressing"]]
        times = 1e3 * steps["step_time_s"]
        if not len(times):
            times = 1e3 * self.steps["step_time_s"]
        return {"median": times.median(), "min": times.min(), "max": times.max(), "steps": len(times)}

    def summary(self) -> dict:
        """One row for comparison tables: error and bytes over the steps where the hook compressed."""
        s, compressed = self.steps, self.compressed_steps()
        row: dict[str, Any] = {"hook": self.name}
        if "rel_error" in s:
            row.update(
                rel_error=compressed["rel_error"].mean(),
                cosine=compressed["cosine"].mean(),
                rank_spread=s["rank_spread"].max(),
            )
        counted = not s["payload_bytes"].isna().all()  # compiled autograd: not counted
        row["compressed_steps"] = f"{int(s['compressing'].sum())}/{len(s)}" if counted else "not counted"
        fp32 = compressed["uncompressed_bytes"].sum()
        row["payload_vs_fp32"] = compressed["payload_bytes"].sum() / fp32 if fp32 else math.nan
        if self.config.get("link") is not None or self.config.get("timing"):
            row["step_ms"] = self.step_ms()["median"]
        row["final_loss"] = self.final.get("loss", math.nan)
        row["accuracy"] = self.final.get("accuracy", math.nan)
        row["ranks_agree"] = self.ranks_agree
        row["notes"] = len(self.notes)
        return row

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "config": self.config,
            "steps": _frame_to_json(self.steps),
            "layers": _frame_to_json(self.layers),
            "notes": self.notes,
            "env": self.env,
            "final": self.final,
            "sample": self.sample,
        }

    def save(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1, allow_nan=True))
        return path

    def __repr__(self) -> str:
        return f"<Result {self.name}: {len(self.steps)} steps, {len(self.notes)} notes>"


class ResultSet(list):
    """Several runs, in the order they ran, with a comparison table."""

    def table(self, formatted: bool = False) -> pd.DataFrame:
        """One row per run (see :meth:`Result.summary`); ``formatted``: numbers as short strings."""
        table = pd.DataFrame([r.summary() for r in self]).set_index("hook")
        if formatted:
            for column, fmt in SUMMARY_FORMATS.items():
                if column in table:
                    table[column] = table[column].map(fmt.format)
        return table

    def by_name(self, name: str) -> Result:
        for r in self:
            if r.name == name:
                return r
        raise KeyError(f"no run named {name!r}; runs: {[r.name for r in self]}")

    def notes(self) -> list[str]:
        return [n for r in self for n in r.notes]

    def save(self, folder) -> list[Path]:
        folder = Path(folder)
        return [r.save(folder / f"{i:02d}_{_slug(r.name)}.json") for i, r in enumerate(self)]


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text).strip("_")


#: The largest file lab.load reads (it reads a file whole): far above any run the lab allows, below a machine's memory.
MAX_FILE_BYTES = 512 << 20
#: The fields of a saved Result, and what each must be.
_FIELDS = {"config": dict, "steps": dict, "layers": dict, "notes": list, "env": dict, "final": dict}


def _frame(path: Path, name: str, data: dict) -> pd.DataFrame:
    """A saved table, checked: ``columns`` names, one dtype per column, rows as long as the columns."""
    columns, dtypes, rows = data.get("columns"), data.get("dtypes"), data.get("data")
    if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
        raise ValueError(f"{path}: {name}.columns must be a list of column names")
    if (
        not isinstance(dtypes, dict)
        or set(dtypes) != set(columns)
        or not all(isinstance(t, str) for t in dtypes.values())
    ):
        raise ValueError(f"{path}: {name}.dtypes must give one dtype name for each of {name}.columns")
    if not isinstance(rows, list) or not all(isinstance(r, list) and len(r) == len(columns) for r in rows):
        raise ValueError(f"{path}: {name}.data must be a list of rows, each with {len(columns)} values")
    try:
        return _frame_from_json(data)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{path}: {name} does not match its dtypes ({exc})") from None


def load(path) -> Result | ResultSet:
    """Read a saved Result (a .json file), or a folder of them as a ResultSet; a file that is not one is refused
    with the field that is wrong."""
    path = Path(path)
    if path.is_dir():
        return ResultSet(load(p) for p in sorted(path.glob("*.json")))
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ValueError(
            f"{path} is {size:,} bytes: no saved Result is that large (lab.load reads at most "
            f"{MAX_FILE_BYTES >> 20} MiB, whole)"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(
            f"{path} is not a saved commhooks_lab Result (not JSON text: {str(exc)[:200]}); lab.load reads what "
            "result.save(path) wrote, or a folder of such files"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path} is not a saved commhooks_lab Result")
    if data.get("version") != VERSION:
        raise ValueError(f"{path} has Result format version {data.get('version')}; this lab reads {VERSION}")
    for name, kind in _FIELDS.items():
        if not isinstance(data.get(name), kind):
            found = "missing" if name not in data else f"a {type(data[name]).__name__}"
            raise ValueError(f"{path}: field {name!r} must be a {kind.__name__}, found {found}")
    if not all(isinstance(note, str) for note in data["notes"]):
        raise ValueError(f"{path}: field 'notes' must be a list of strings")
    if not isinstance(data.get("sample"), (dict, type(None))):
        raise ValueError(f"{path}: field 'sample' must be a dict or null")
    return Result(
        data["config"],
        _frame(path, "steps", data["steps"]),
        _frame(path, "layers", data["layers"]),
        data["notes"],
        data["env"],
        data["final"],
        data.get("sample"),
    )


def from_ranks(config_dict: dict, ranks: Iterable[dict]) -> Result:
    """Assemble a Result from the values the ranks returned."""
    ranks = list(ranks)
    main = ranks[0]
    steps = pd.DataFrame(main["steps"])
    if "accuracy" not in steps:
        steps["accuracy"] = math.nan
    first = ["step", "loss", "accuracy"]
    steps = steps[first + [c for c in steps.columns if c not in first]]
    layers = pd.DataFrame(main["layers"])
    final = {**main["final"], "param_digests": [r["param_digest"] for r in ranks]}
    return Result(config_dict, steps, layers, list(main["notes"]), main["env"], final, main["sample"])
