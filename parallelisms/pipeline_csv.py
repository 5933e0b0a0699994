"""A pipeline schedule written as a CSV of actions, one row per pp rank
(`pipeline_parallel_schedule_csv`), read and checked against the layout by one function: preflight
calls it before launch and `build_schedule` hands its actions to torch's
`_PipelineScheduleRuntime`, so what preflight accepts is exactly what runs.

The runtime takes compute actions only and adds the sends, receives, FSDP unshards and gradient
reductions itself: F (forward), B (full backward), I (input backward), W (weight backward), each
`<stage><kind><micro-batch>` (0F1), and `(0F1;1B0)OVERLAP_F_B` groups, whose actions it runs in
order. Torch checks little of the rest before the first step: a stage id past the layout dies
there with `KeyError`, a rank naming another rank's stage or a cycle between ranks hangs.
"""

from __future__ import annotations

import csv
import re
from collections import defaultdict

from torch.distributed.pipelining.schedules import (
    OVERLAP_F_B,
    _Action,
    _action_regex,
    _ComputationType,
)

from parallelisms.parallel_dims import LayoutError

KEY = "parallelism.pipeline_parallel_schedule_csv"
COMPUTE = {"F", "B", "I", "W"}
_GROUP = re.compile(r"\((.*)\)OVERLAP_F_B")
Actions = dict[int, list[_Action | None]]
Key = tuple[str, int, int | None]  # kind, stage, micro-batch


def read_schedule_csv(path: str, rank_stages: list[list[int]], n_microbatches: int) -> Actions:
    """The actions of each pp rank r (row r + 1), every one checked: a compute action of a stage
    that rank r holds (`rank_stages[r]`) on a micro-batch below `n_microbatches`; every stage's
    forward and backward (B, or I then W) of every micro-batch exactly once, after its forward;
    and an order in which no rank waits forever for another. LayoutError (one line) otherwise."""
    rows = _rows(path, len(rank_stages))
    actions = {
        r: [_parse(path, r, cell, rank_stages, n_microbatches) for cell in row]
        for r, row in enumerate(rows)
    }
    _check_each_once(path, actions, rank_stages, n_microbatches)
    _check_no_rank_waits_forever(path, actions, sum(map(len, rank_stages)))
    return actions


def _rows(path: str, pp: int) -> list[list[str]]:
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        why = getattr(e, "strerror", None) or e
        raise LayoutError(f"{KEY} = {path}: cannot read it ({why})") from None
    while rows and not any(cell.strip() for cell in rows[-1]):
        rows.pop()  # trailing blank lines; any other row is a rank's, empty or not
    if len(rows) != pp:
        raise LayoutError(
            f"{KEY} = {path}: {len(rows)} row(s) of actions, one per pipeline rank expected ({pp})"
        )
    return rows


def _at(path: str, rank: int) -> str:
    return f"{KEY} = {path}: row {rank + 1} (pp rank {rank})"


def _parse(
    path: str, rank: int, cell: str, rank_stages: list[list[int]], n_mb: int
) -> _Action | None:
    text = cell.strip()
    if not text:
        return None  # an idle slot, as torch reads it
    if group := _GROUP.fullmatch(text):
        parts = [p.strip() for p in group.group(1).split(";") if p.strip()]
        if not parts:
            raise LayoutError(f"{_at(path, rank)}: {text!r} groups no action")
        subs = tuple(_compute(path, rank, p, rank_stages, n_mb) for p in parts)
        return _Action(-1, OVERLAP_F_B, None, subs)
    return _compute(path, rank, text, rank_stages, n_mb)


def _compute(path: str, rank: int, text: str, rank_stages: list[list[int]], n_mb: int) -> _Action:
    at = _at(path, rank)
    match = _action_regex.fullmatch(text)
    if match is None:
        raise LayoutError(
            f"{at}: {text!r} is not an action (stage, F/B/I/W, micro-batch: e.g. 0F1)"
        )
    stage, kind, mb = match.groups()
    if kind not in COMPUTE:
        raise LayoutError(
            f"{at}: {text!r}: the CSV runtime takes compute actions only, F, B, I or W (it adds "
            "sends, receives, unshards and gradient reductions itself)"
        )
    if not mb:
        raise LayoutError(f"{at}: {text!r} has no micro-batch number (e.g. {stage}{kind}0)")
    mine = rank_stages[rank]
    if int(stage) not in mine:
        total = sum(map(len, rank_stages))
        raise LayoutError(
            f"{at}: {text!r} names stage {stage}, which pp rank {rank} does not hold; this row "
            f"may name stage {_list(mine)} (the layout has {total} stages, ids 0-{total - 1})"
        )
    if int(mb) >= n_mb:
        raise LayoutError(
            f"{at}: {text!r} names micro-batch {mb}; there are {n_mb}, ids 0-{n_mb - 1} "
            "(training.local_batch_size / pipeline_parallel_microbatch_size)"
        )
    return _Action(int(stage), _ComputationType(kind), int(mb))


def _list(ids: list[int]) -> str:
    return " or ".join(map(str, ids))


def _key(a: _Action) -> Key:
    return a.computation_type.value, a.stage_index, a.microbatch_index


def _flat(row: list[_Action | None]) -> list[_Action]:
    """A row's compute actions in the order the runtime runs them (groups opened)."""
    out: list[_Action] = []
    for a in row:
        if a is not None:
            out.extend(a.sub_actions if a.sub_actions is not None else (a,))
    return out


def _check_each_once(path: str, actions: Actions, rank_stages: list[list[int]], n: int) -> None:
    for rank, row in actions.items():
        at = _at(path, rank)
        found: dict[Key, list[int]] = defaultdict(list)  # where each action is, in run order
        for position, a in enumerate(_flat(row)):
            found[_key(a)].append(position)
        for s in rank_stages[rank]:
            for mb in range(n):
                f, b, i, w = (found[(k, s, mb)] for k in "FBIW")
                if len(f) != 1:
                    raise LayoutError(
                        f"{at}: runs {s}F{mb} {len(f)} times; every forward of each of its "
                        f"stages' micro-batches (0-{n - 1}) runs exactly once"
                    )
                if (len(b), len(i), len(w)) not in ((1, 0, 0), (0, 1, 1)):
                    raise LayoutError(
                        f"{at}: the backward of stage {s}, micro-batch {mb} runs as "
                        f"{len(b)} x {s}B{mb}, {len(i)} x {s}I{mb} and {len(w)} x {s}W{mb}; "
                        f"it must run exactly once: {s}B{mb}, or {s}I{mb} then {s}W{mb}"
                    )
                back, kind = (b, "B") if b else (i, "I")
                if back[0] < f[0]:
                    raise LayoutError(
                        f"{at}: {s}{kind}{mb} comes before {s}F{mb}; a backward runs after "
                        "its forward"
                    )
                if w and w[0] < i[0]:
                    raise LayoutError(
                        f"{at}: {s}W{mb} comes before {s}I{mb}; the weight backward runs after "
                        "the input backward"
                    )


def _check_no_rank_waits_forever(path: str, actions: Actions, num_stages: int) -> None:
    """Run the rows as the ranks would: a forward waits for the previous stage's forward of its
    micro-batch, an input or full backward for the next stage's backward; stop when every row is
    done, or at the first row that can never go on (the run would hang there)."""
    done: set[Key] = set()

    def needs(a: _Action) -> list[Key]:
        s, kind, mb = a.stage_index, a.computation_type.value, a.microbatch_index
        if kind == "F" and s > 0:
            return [("F", s - 1, mb)]
        if kind in "BI" and s < num_stages - 1:
            return [("B", s + 1, mb), ("I", s + 1, mb)]
        return []

    def ready(slot: _Action | None) -> bool:
        parts = [] if slot is None else _flat([slot])
        return all(not needs(a) or any(n in done for n in needs(a)) for a in parts)

    position = {r: 0 for r in actions}
    progress = True
    while progress:
        progress = False
        for r, row in actions.items():
            while position[r] < len(row) and ready(row[position[r]]):
                done.update(_key(a) for a in _flat([row[position[r]]]))
                position[r] += 1
                progress = True
    for r, row in actions.items():
        if position[r] < len(row):
            slot = row[position[r]]
            assert slot is not None  # an idle slot is always ready
            waiting = next(a for a in _flat([slot]) if not any(n in done for n in needs(a)))
            kind, s, mb = needs(waiting)[0]
            raise LayoutError(
                f"{_at(path, r)}: action {position[r] + 1} ({slot}) waits for {s}{kind}{mb}, "
                f"which never comes before it: the ranks would wait for each other forever; "
                "order each row so that a forward follows the previous stage's and a backward "
                "the next stage's"
            )
