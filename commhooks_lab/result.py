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

from .safe_files import Folder, parse_json, read_file, shown

__all__ = ["from_json", "from_ranks", "load", "Result", "ResultSet", "VERSION"]

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
        """Write the result whole under a hidden name, then rename it to ``path``: a link already at ``path`` is
        replaced, never written through, and a full disk leaves no half file."""
        path = Path(path)
        text = json.dumps(self.to_json(), indent=1, allow_nan=True)
        with Folder.open(path.parent, "remove it, or save under another name", create=True) as folder:
            folder.write(path.name, text.encode())
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


#: The largest file lab.load reads (it reads a file whole, and JSON takes ~10x its size in memory): a 1,000-step
#: run of the widest model saves a few MB.
MAX_FILE_BYTES = 64 << 20
#: The fields of a saved Result, and what each must be.
_FIELDS = {"config": dict, "steps": dict, "layers": dict, "notes": list, "env": dict, "final": dict}
#: The column types the lab saves (``str(dtype)``); any other is refused before pandas tries it (an extension
#: type may import a library that is missing, ``"S2000000000"`` asks for 2 GB per value).
SAVED_DTYPES = frozenset(
    ["bool", "object", "str", "float32", "float64"] + [f"{u}int{b}" for u in ("", "u") for b in (8, 16, 32, 64)]
)
#: What lab.load tells a learner whose file it refuses.
_ADVICE = "lab.load reads what result.save(path) wrote, or a folder of such files"


def _frame(path: Path, name: str, data: dict) -> pd.DataFrame:
    """A saved table, checked: ``columns`` names, one dtype per column, rows as long as the columns."""
    columns, dtypes, rows = data.get("columns"), data.get("dtypes"), data.get("data")
    if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
        raise ValueError(f"{shown(path)}: {name}.columns must be a list of column names")
    if len(set(columns)) != len(columns):
        twice = sorted({c for c in columns if columns.count(c) > 1})
        raise ValueError(f"{shown(path)}: {name}.columns names {twice} more than once; each column is named once")
    if (
        not isinstance(dtypes, dict)
        or set(dtypes) != set(columns)
        or not all(isinstance(t, str) for t in dtypes.values())
    ):
        raise ValueError(f"{shown(path)}: {name}.dtypes must give one dtype name for each of {name}.columns")
    unknown = {c: t for c, t in dtypes.items() if t not in SAVED_DTYPES}
    if unknown:
        raise ValueError(
            f"{shown(path)}: {name}.dtypes {unknown} are not types the lab saves ({', '.join(sorted(SAVED_DTYPES))})"
        )
    if not isinstance(rows, list) or not all(isinstance(r, list) and len(r) == len(columns) for r in rows):
        raise ValueError(f"{shown(path)}: {name}.data must be a list of rows, each with {len(columns)} values")
    try:
        return _frame_from_json(data)
    except (ValueError, TypeError, OverflowError) as exc:
        raise ValueError(f"{shown(path)}: {name} does not match its dtypes ({exc})") from None


def _check_final(path: Path, final: dict) -> None:
    """The fields of ``final`` that tables and checks read: digests as strings, loss and accuracy as numbers."""
    digests = final.get("param_digests", [])
    if not isinstance(digests, list) or not all(isinstance(d, str) for d in digests):
        raise ValueError(f"{shown(path)}: final.param_digests must be a list of strings (one per rank)")
    for key in ("loss", "accuracy"):
        value = final.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"{shown(path)}: final.{key} must be a number, found {type(value).__name__}")


def _load_folder(path: Path) -> ResultSet:
    """Every ``*.json`` in ``path``, in name order; a link, FIFO, device or folder among them is refused by name."""
    results = ResultSet()
    with Folder.open(path, "copy the result file itself there, or load it by its own path") as folder:
        for name in folder.names():
            if name.endswith(".json") and not name.startswith("."):
                results.append(_parse(path / name, folder.read(name, MAX_FILE_BYTES)))
    return results


def load(path) -> Result | ResultSet:
    """Read a saved Result (a .json file), or a folder of them as a ResultSet; a file that is not one is refused
    with the field that is wrong. No link inside a folder is followed, and no FIFO or device is opened."""
    path = Path(path)
    if path.is_dir():
        return _load_folder(path)
    return _parse(path, read_file(path, MAX_FILE_BYTES, _ADVICE))


def _parse(path: Path, raw: bytes) -> Result:
    return from_json(parse_json(raw, path, f"it is not a saved commhooks_lab Result; {_ADVICE}"), path)


def from_json(data: object, path: Path) -> Result:
    """The Result that :meth:`Result.to_json` gave ``data`` for, checked field by field; messages name ``path``."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{shown(path)} is not a saved commhooks_lab Result; {_ADVICE}")
    if data.get("version") != VERSION:
        raise ValueError(f"{shown(path)} has Result format version {data.get('version')}; this lab reads {VERSION}")
    for name, kind in _FIELDS.items():
        if not isinstance(data.get(name), kind):
            found = "missing" if name not in data else f"a {type(data[name]).__name__}"
            raise ValueError(f"{shown(path)}: field {name!r} must be a {kind.__name__}, found {found}")
    if not all(isinstance(note, str) for note in data["notes"]):
        raise ValueError(f"{shown(path)}: field 'notes' must be a list of strings")
    if not isinstance(data.get("sample"), (dict, type(None))):
        raise ValueError(f"{shown(path)}: field 'sample' must be a dict or null")
    _check_final(path, data["final"])
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
    if all("link_totals" in r for r in ranks):  # each rank's bytes and hops per level, summed over its steps
        final["link_totals"] = [r["link_totals"] for r in ranks]
    return Result(config_dict, steps, layers, list(main["notes"]), main["env"], final, main["sample"])
