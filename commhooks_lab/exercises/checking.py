"""The checks every exercise module is built from: an :class:`Outcome`, the reference registry, and the
messages for an answer that is no answer at all (a wrong type, a misspelt choice).

Public so that a new notebook's exercises module imports what the twelve others do, by names that say
they are meant to be imported.
"""

from __future__ import annotations

import ast
import inspect
import numbers
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "NOT_ATTEMPTED",
    "NOTHING_LATER",
    "RIGHT",
    "WORLD_SIZES",
    "WRONG",
    "Outcome",
    "bool_problem",
    "check_function",
    "check_prediction",
    "choice_problem",
    "clusters_by_size",
    "first_problem_by_world_size",
    "is_stub",
    "listed",
    "reference",
    "reveal",
    "run_beside_reference",
    "say",
    "whole_number_problem",
]

NOT_ATTEMPTED, WRONG, RIGHT = "not attempted", "wrong", "right"
#: ``check_function(later=...)`` for an exercise whose answer nothing later in its notebook uses.
NOTHING_LATER = "Nothing later in the notebook depends on it."
#: The world sizes a hook's check runs at, in this order: a 2 written for the world size is right at 2 ranks only,
#: and a 3 or a 4 where the rank count should be is caught at the size after.
WORLD_SIZES = (2, 3, 4)


@dataclass
class Outcome:
    """What a check decided, and the value the rest of the notebook should use."""

    status: str  # NOT_ATTEMPTED | WRONG | RIGHT
    message: str
    value: Any = None

    def __repr__(self) -> str:  # a check's result printed at the end of a cell reads as its message
        return self.message


_REFERENCES: dict[str, Callable] = {}


def reference(name: str) -> Callable[[Callable], Callable]:
    """Register a reference solution under ``name`` (shown by :func:`reveal`)."""

    def register(fn: Callable) -> Callable:
        _REFERENCES[name] = fn
        return fn

    return register


def reveal(name: str) -> None:
    """Print the reference solution of exercise ``name``: for when you are stuck, not before."""
    if name not in _REFERENCES:
        raise KeyError(f"no exercise {name!r}; exercises: {sorted(_REFERENCES)}")
    print(textwrap.dedent(inspect.getsource(_REFERENCES[name])))


def is_stub(attempt: Any) -> bool:
    """None, a function whose body (after a docstring) is only ``pass``, or one with a top-level
    ``raise NotImplementedError`` (a stub, or a scaffold whose learner's part is missing)."""
    if attempt is None:
        return True
    if not callable(attempt):
        return False
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(attempt)))
    except (OSError, TypeError, SyntaxError):
        return False
    func = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.Lambda)), None)
    if not isinstance(func, ast.FunctionDef):
        return False
    body = [s for s in func.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if not body or (len(body) == 1 and isinstance(body[0], ast.Pass)):
        return True
    # a stub, or a scaffold whose learner's part is still a top-level `raise NotImplementedError`
    return any(_raises_not_implemented(stmt) for stmt in body)


def _raises_not_implemented(stmt: ast.stmt) -> bool:
    if not (isinstance(stmt, ast.Raise) and stmt.exc is not None):
        return False
    exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


def say(outcome: Outcome) -> Outcome:
    """Print a check's message (the learner reads it under the cell) and hand the outcome on."""
    print(outcome.message)
    return outcome


def _not_attempted(name: str, what: str = "the reference solution", later: str | None = None) -> Outcome:
    """``later``: what the rest of the notebook does without an answer, when it is not "uses the reference"."""
    stuck = f"run it and this cell again (stuck? lab.exercises.reveal({name!r}))."
    if later is not None:
        return Outcome(NOT_ATTEMPTED, f"· {name}: not attempted yet. {later} Write yours in the cell above and {stuck}")
    return Outcome(
        NOT_ATTEMPTED,
        f"· {name}: not attempted yet. The rest of the notebook uses {what}; write yours in the cell above and {stuck}",
    )


def check_function(
    name: str, attempt: Any, verify: Callable[[Callable], str | None], passed: str, later: str | None = None
) -> Outcome:
    """Check a function the learner wrote. ``verify(fn)`` returns None if right, else a hint.

    The outcome's ``value`` is the learner's function if right, else the reference, so the
    notebook carries on either way. An exception from the learner's code is a wrong attempt.
    ``later``: say this instead of "the rest of the notebook uses the reference" (nothing later uses it).
    """
    ref = _REFERENCES[name]
    if is_stub(attempt):
        outcome = _not_attempted(name, later=later)
        outcome.value = ref
        return say(outcome)
    try:
        problem = verify(attempt)
    except NotImplementedError:
        outcome = _not_attempted(name, later=later)
        outcome.value = ref
        return say(outcome)
    except Exception as exc:  # the learner's code raised: say what, where to look
        first_line = (str(exc).splitlines() or [""])[0]
        problem = f"your code raised {type(exc).__name__}: {first_line}"
    if problem:
        return say(
            Outcome(
                WRONG,
                f"✗ {name}: not yet. {problem} "
                + (
                    f"({later})"
                    if later is not None
                    else "(The rest of the notebook uses the reference solution until this check passes.)"
                ),
                ref,
            )
        )
    return say(Outcome(RIGHT, f"✓ {name}: right. {passed}", attempt))


def run_beside_reference(
    attempt: Callable,
    reference_hook: Callable,
    state_factory: Callable,
    steps: int,
    cluster: Any = None,
    **changes: Any,
):
    """Your hook and the reference on the same data and seed, through the lab: (your steps, the reference's)."""
    from ..experiment import compare

    mine, theirs = compare(
        [{"hook": attempt, "label": "yours"}, {"hook": reference_hook, "label": "reference"}],
        state_factory=state_factory,
        steps=steps,
        cluster=cluster,
        **changes,
    )
    return mine.steps, theirs.steps


def clusters_by_size(cluster: Any) -> dict[int, Any]:
    """A check's ``cluster`` argument (one Cluster, several, or None) by world size."""
    return {c.world_size: c for c in (cluster if isinstance(cluster, list | tuple) else [cluster]) if c is not None}


def first_problem_by_world_size(
    problem_at: Callable[[Any], str | None], cluster: Any = None, world_sizes: Sequence[int] = WORLD_SIZES
) -> str | None:
    """``problem_at(ranks)`` at each world size in turn, on the Cluster of that size in ``cluster`` (one Cluster,
    several, or None) or else on a Cluster started for it and stopped after (one start per size); the first problem,
    said with the size it showed at. Right at 2 ranks and wrong at more gets the hint for "2" in place of the world
    size (or rank 1 as "the other")."""
    from ..launcher import Ranks, RankSpec

    given = clusters_by_size(cluster)
    right_at: list[int] = []
    for world in world_sizes:
        if world in given:
            problem = problem_at(given[world])
        else:
            with Ranks(fresh=True) as fresh:  # started for this size, stopped before the next
                problem = problem_at(fresh(RankSpec(world)))
        if problem is None:
            right_at.append(world)
        elif right_at == [2]:
            return (
                f"right at 2 ranks, but at {world}: {problem} Something in your code holds only for two ranks: a 2 "
                "where the world size belongs (dist.get_world_size()), or rank 1 as 'the other' rank."
            )
        else:
            return problem if world == world_sizes[0] else f"at {world} ranks: {problem}"
    return None


def listed(world_sizes: Sequence[int]) -> str:
    """(2, 3, 4) as "2, 3 and 4"."""
    *most, last = map(str, world_sizes)
    return f"{', '.join(most)} and {last}" if most else last


def check_prediction(
    name: str,
    attempt: Any,
    answer: Any,
    hint: str,
    explanation: str = "",
    *,
    slips: Sequence[tuple[Any, str]] = (),
    malformed: Callable[[Any], str | None] | None = None,
) -> Outcome:
    """Check a prediction committed *before* the measurement that answers it is shown.

    ``hint`` says what to look at without giving the answer; ``explanation`` is shown once right.
    ``slips`` pairs plausible wrong answers with a hint of their own (used instead of ``hint``);
    ``malformed(attempt)`` returns a message when the attempt is no answer at all (a wrong type, a
    misspelt choice, a number out of range), else None: it is checked first, so ``True`` never
    passes for ``1``.
    """
    if attempt is None:
        return say(
            Outcome(
                NOT_ATTEMPTED,
                f"· {name}: no prediction made. Write one in the prediction cell, "
                "then compare it with the measurement above.",
                answer,
            )
        )
    problem = malformed(attempt) if malformed is not None else None
    if problem:
        return say(Outcome(WRONG, f"✗ {name}: {problem}", answer))
    if _equal(attempt, answer):
        return say(Outcome(RIGHT, f"✓ {name}: right. {explanation}".rstrip(), answer))
    own = next((text for value, text in slips if _equal(attempt, value)), hint)
    return say(Outcome(WRONG, f"✗ {name}: not yet. {own}", answer))


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # an array compared element by element, say: not an answer's equal
        return False


def choice_problem(attempt: Any, choices: Sequence[Any]) -> str | None:
    """A message if ``attempt`` is not one of the string ``choices`` (a wrong type, a misspelling), else None."""
    if isinstance(attempt, str) and attempt in choices:
        return None
    listed = " or ".join(repr(c) for c in choices)
    if not isinstance(attempt, str):
        return f"answer with one of the strings {listed}, not the {type(attempt).__name__} {attempt!r}."
    return f"{attempt!r} is not one of the choices: answer {listed}, spelt exactly so."


def whole_number_problem(attempt: Any, what: str, minimum: int = 0) -> str | None:
    """A message if ``attempt`` is not a whole number >= ``minimum`` (a bool, a str, a fraction), else None."""
    if isinstance(attempt, bool) or not isinstance(attempt, numbers.Integral):
        if isinstance(attempt, float) and attempt.is_integer() and attempt >= minimum:
            return None
        return f"{what} is a whole number (an int), got {type(attempt).__name__} {attempt!r}."
    if attempt < minimum:
        return f"{what} is at least {minimum}, got {attempt!r}."
    return None


def bool_problem(attempt: Any) -> str | None:
    """A message if ``attempt`` is not True or False (a NumPy bool counts), else None."""
    if isinstance(attempt, bool) or type(attempt).__name__ == "bool_":
        return None
    return f"answer True or False (a bool), not the {type(attempt).__name__} {attempt!r}."
