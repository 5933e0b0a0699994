"""Correctness pass for the GPU paths that CPU tests cannot reach, on one CUDA device (NCCL).

Each check prints PASS / FAIL / SKIPPED with its figure and bound; the summary goes to
OUT/gpu_check.json and OUT/gpu_check.txt, each run's log to OUT/logs/. Runs are real
`python -m titanlite.train` / `python -m titanlite.dry_run` processes, so they check what users
launch; only (a) builds two trainers in one worker process, to compare their gradients.

  (a) grads     compiled vs eager per-parameter gradients of the whole debug model, one step from
                the same weights and batch (float32): relative error <= 1e-4 for every parameter,
                and no parameter whose eager gradient is non-zero gets a zero or missing one.
  (b) float8    50 steps of float8 tensorwise vs the same 50 steps without it (bf16 on GPU):
                every step's loss within 5% relative (the bound of the CPU float8 training
                test), and the float8 loss falls.
  (c) resume    checkpoint.async_mode = async_with_pinned_mem, 10 steps saving at 5 and 10; a
                run resumed from step 5 logs the uninterrupted run's losses at steps 6-10 bit
                for bit (training.deterministic).
  (d) determ.   training.deterministic: a second identical run gives the same 10 losses bit for
                bit.
  (e) snapshot  profiling.enable_memory_snapshot writes an allocator snapshot that unpickles.
  (f) dry run   the dry run's per-rank total vs the run's torch.cuda.max_memory_allocated peak
                for one config (a 4-layer dim-1024 model, bf16, seq 2048 x batch 4, no AC):
                predicted / measured within [0.75, 1.25] (the activation formula's calibration
                bound, docs/dry_run.md).

  (g) attention the default block_causal kernel (attn_type 'auto': flash varlen on CUDA, the
                CPU document kernel in --smoke) vs masked SDPA, 20 steps each from the same
                seed (bf16 on GPU): every step's loss within 1e-3.
  (h) cp pieces context parallel's per-document pieces through the default kernel (flash
                `varlen_attn` on CUDA, bf16; the CPU kernel in float32 under --smoke), in this
                process: every simulated cp rank (cp 2, 4, 8, head-tail cut) of an 8B-shaped
                grouped-query attention at seq 4096 with documents crossing the chunk borders,
                against one float32 masked SDPA over the whole sequence; outputs and the q/k/v
                gradients summed over the ranks within 2e-2 relative in norm (bf16; 1e-5 in
                float32). This checks flash's bottom-right causal alignment the pieces rely on.
  (i) fsdp      a one-rank process group of the run's device (NCCL on CUDA, gloo under --smoke):
                an all-reduce and a DTensor redistribution (which create the NCCL communicator),
                then titanlite's FSDP2 wrapping of the debug model (parameters are DTensors)
                against the same model unsharded, 2 AdamW steps with clipping in float32: every
                loss, gradient norm and final parameter within 1e-5 relative; and a bf16-
                parameter FSDP step whose loss is within 2e-2 of float32's.
  (j) block-causal  every block_causal kernel on the same inputs (flash varlen and masked
                SDPA; compiled FlexAttention on CUDA only), bf16 on CUDA (float32 on CPU), 32
                query / 8 key-value heads of 128 at seq 4096 (tiny under --smoke), documents of
                every length (one starts before the window, one is a single token): outputs and
                q/k/v gradients against one explicit float32 computation (scores, the mask of
                models/attention.py's block_causal_mask, softmax) within 2e-2 relative in norm
                (1e-5 in float32).
  (k) float8 checkpoint  a checkpoint saved from torchao's FSDP float8 weights (one-rank mesh;
                on CUDA after one real step, whose all-gather moves float8) loads in a fresh
                process that cannot import torchao: plain tensors equal to what was saved, and
                a one-step trainer run (bf16 on CUDA) starts from it.

    python scripts/gpu_check.py --out DIR            # on a GPU machine (not yet run on one)
    python scripts/gpu_check.py --smoke --out DIR    # CPU/gloo rehearsal, tiny sizes

--smoke runs the same code paths on CPU in tiny sizes: float32 reference and emulated float8 in
(b), async_with_pinned_mem falls back to 'async' in (c) (the trainer says so), and (e) and (f)
report SKIPPED because they need the CUDA allocator.

Nothing needs installing: run from a checkout, the script puts the checkout's root on the path of
every process it starts (torch, torchdata and tokenizers must be importable; without torchao,
(b) and (k) report SKIPPED).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Run as a file, this process has scripts/ on its path, not the checkout it belongs to.
sys.path.insert(0, str(ROOT))
from titanlite.core.arguments import ArgumentParser, int_arg  # noqa: E402
from titanlite.core.errors import USER_ERROR  # noqa: E402

DEBUG_TOML = ROOT / "train_configs" / "debug_model.toml"

GRAD_REL_BOUND = 1e-4
FLOAT8_REL_BOUND = 0.05
FLOAT8_STEPS = 50  # --smoke: 10, enough to run the same code
MEMORY_RATIO_BOUNDS = (0.75, 1.25)
RESUME_STEPS, RESUME_AT = 10, 5
ATTENTION_STEPS, ATTENTION_BOUND = 20, 1e-3
CP_PIECES_BOUND = {"bfloat16": 2e-2, "float32": 1e-5}

QUIET = ["--metrics.log_freq", "1", "--metrics.enable_tensorboard", "false"]


class Context:
    def __init__(self, smoke: bool, out: Path, work: Path, timeout: int):
        self.smoke, self.out, self.work, self.timeout = smoke, out, work, timeout
        self.float8_steps = 10 if smoke else FLOAT8_STEPS
        self.cuda = _cuda_info()
        self.on_gpu = not smoke and self.cuda is not None
        (out / "logs").mkdir(parents=True, exist_ok=True)
        # Every run: the debug model; smaller and shorter on CPU.
        self.base = ["--config", str(DEBUG_TOML), "--eval.enabled", "false", *QUIET]
        if smoke:
            self.base += [
                "--model.n_layers",
                "2",
                "--training.seq_len",
                "64",
                "--training.local_batch_size",
                "2",
            ]

    def run(self, name: str, module: str, args: list[str]) -> subprocess.CompletedProcess:
        """One real entry point as its own process; its output kept in OUT/logs/NAME.log."""
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        env["PYTHONUNBUFFERED"] = "1"
        # The checkout is what runs, installed or not (an offline GPU machine has no pip).
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
        cmd = [sys.executable, *(["-m", module] if module.startswith("titanlite") else [module])]
        cmd += args
        try:
            proc = subprocess.run(
                cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=self.timeout
            )
        except subprocess.TimeoutExpired as e:
            proc = subprocess.CompletedProcess(
                cmd, 124, _text(e.stdout), _text(e.stderr) + f"\ntimed out after {self.timeout}s"
            )
        log = f"$ {' '.join(cmd)}\nexit {proc.returncode}\n--- stdout\n{proc.stdout}\n"
        (self.out / "logs" / f"{name}.log").write_text(log + f"--- stderr\n{proc.stderr}")
        return proc

    def train(self, name: str, *args: str) -> subprocess.CompletedProcess:
        folder = self.work / name
        return self.run(
            name, "titanlite.train", [*self.base, *args, "--job.dump_folder", str(folder)]
        )


def _text(b) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def _cuda_info() -> dict | None:
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return {
        "name": props.name,
        "capability": f"{props.major}.{props.minor}",
        "memory_gib": props.total_memory / 2**30,
    }


def failure(proc: subprocess.CompletedProcess) -> str:
    """The line that says why a run failed (its last error line, else its last line)."""
    lines = [x for x in proc.stderr.strip().splitlines() if x.strip()] or ["(no output)"]
    errors = [x for x in lines if "Error" in x or "error:" in x or "timed out" in x]
    return f"exit {proc.returncode}: {(errors or lines)[-1].strip()[:300]}"


def losses(folder: Path) -> dict[int, float]:
    path = folder / "metrics.jsonl"
    if not path.exists():
        return {}
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return {r["step"]: r["loss"] for r in rows}


def result(check: str, name: str, status: str, figure: str, bound: str, **extra) -> dict:
    return {
        "check": check,
        "name": name,
        "status": status,
        "figure": figure,
        "bound": bound,
        **extra,
    }


# ---------------------------------------------------------------------------------------------
# (a) compiled vs eager gradients


def grads_worker(out_json: Path, argv: list[str]) -> int:
    """Build the real Trainer twice (eager, then training.compile) from the same seed, run one
    train_step on the same first batch with clipping off, and compare every parameter's .grad."""
    import torch

    from titanlite.preflight import checks as preflight
    from titanlite.trainer.trainer import Trainer

    grads: dict[str, dict[str, torch.Tensor | None]] = {}
    for side, extra in (("eager", []), ("compiled", ["--training.compile"])):
        job, pre = preflight.run([*argv, *extra, "--job.dump_folder", f"{out_json}.{side}"], 1)
        trainer = Trainer(job, pre)
        try:
            trainer.train_step(trainer.next_microbatches(iter(trainer.dataloader)))
            grads[side] = {
                # compile and AC wrap modules; the parameter is the same one.
                re.sub(r"(_orig_mod|_checkpoint_wrapped_module)\.", "", name): (
                    None if p.grad is None else p.grad.detach().float().cpu().clone()
                )
                for name, p in trainer.model.named_parameters()
            }
        finally:
            trainer.close()
    rows = {}
    for name, ge in grads["eager"].items():
        gc = grads["compiled"].get(name)
        eager_norm = 0.0 if ge is None else ge.norm().item()
        row = {"eager_norm": eager_norm, "compiled_norm": None, "rel": None, "lost": False}
        if gc is None or (eager_norm > 0 and gc.count_nonzero().item() == 0):
            row["lost"] = eager_norm > 0
        if gc is not None:
            row["compiled_norm"] = gc.norm().item()
            if ge is not None:
                row["rel"] = (gc - ge).norm().item() / max(eager_norm, 1e-30)
        rows[name] = row
    missing = sorted(set(grads["compiled"]) - set(grads["eager"]))
    Path(out_json).write_text(json.dumps({"params": rows, "only_in_compiled": missing}))
    return 0


def check_grads(ctx: Context) -> list[dict]:
    out_json = ctx.work / "grads.json"
    args = ["--training.mixed_precision_param", "float32", "--training.max_norm", "0"]
    proc = ctx.run(
        "a_grads",
        str(Path(__file__).resolve()),
        ["--grads-worker", str(out_json), "--", *ctx.base, *args],
    )
    name = "compiled vs eager per-parameter gradients (debug model, float32)"
    if proc.returncode != 0 or not out_json.exists():
        return [result("a", name, "FAIL", failure(proc), f"rel <= {GRAD_REL_BOUND:g}")]
    data = json.loads(out_json.read_text())
    rows = data["params"]
    compared = {n: r["rel"] for n, r in rows.items() if r["rel"] is not None}
    worst = max(compared, key=compared.get, default=None)
    lost = [n for n, r in rows.items() if r["lost"] or (r["rel"] is None and r["eager_norm"] > 0)]
    ok = worst is not None and compared[worst] <= GRAD_REL_BOUND and not lost
    ok = ok and not data["only_in_compiled"]
    figure = (
        f"worst {compared[worst]:.2e} ({worst})" if worst else "no gradient compared"
    ) + f"; {len(lost)} lost gradient(s)"
    if lost:
        figure += f": {', '.join(lost[:3])}"
    return [
        result(
            "a",
            name,
            "PASS" if ok else "FAIL",
            figure,
            f"rel <= {GRAD_REL_BOUND:g} per parameter, none lost",
            per_parameter=rows,
        )
    ]


# ---------------------------------------------------------------------------------------------
# (b) float8 vs high precision


def _no_torchao(check: str, name: str, bound: str) -> list[dict]:
    why = "torchao is not importable here (carry its wheel: docs/performance.md)"
    return [result(check, name, "SKIPPED", why, bound)]


def check_float8(ctx: Context) -> list[dict]:
    if importlib.util.find_spec("torchao") is None:
        return _no_torchao("b", "float8 vs high precision", f"within {FLOAT8_REL_BOUND:.0%}")
    steps = ["--training.steps", str(ctx.float8_steps)]
    if ctx.smoke or ctx.cuda is None:
        # CPU: bf16 matmuls are far slower than float32 here, as in the CPU float8 test.
        precision, ref_name = ["--training.mixed_precision_param", "float32"], "float32"
        f8 = ["--model.converters", "float8", "--float8.emulate", "true"]
        f8_name = "emulated float8"
    else:
        precision, ref_name = ["--training.mixed_precision_param", "bfloat16"], "bf16"
        f8 = ["--model.converters", "float8", "--float8.recipe_name", "tensorwise"]
        f8_name = "float8 tensorwise"
        if tuple(map(int, ctx.cuda["capability"].split("."))) < (8, 9):
            f8 += ["--float8.emulate", "true"]  # no float8 tensor cores on this GPU
            f8_name = "emulated float8 (compute capability < 8.9)"
    name = f"{f8_name} vs {ref_name}, {ctx.float8_steps} steps"
    bound = f"every step within {FLOAT8_REL_BOUND:.0%} relative; float8 loss falls"
    ref = ctx.train("b_reference", *precision, *steps)
    if ref.returncode != 0:
        return [result("b", name, "FAIL", f"{ref_name} run: {failure(ref)}", bound)]
    low = ctx.train("b_float8", *precision, *f8, *steps)
    if low.returncode != 0:
        return [result("b", name, "FAIL", f"float8 run: {failure(low)}", bound)]
    want, got = losses(ctx.work / "b_reference"), losses(ctx.work / "b_float8")
    if sorted(got) != sorted(want) or len(got) != ctx.float8_steps:
        return [result("b", name, "FAIL", f"logged steps differ: {len(want)} vs {len(got)}", bound)]
    rel = {s: abs(got[s] - want[s]) / abs(want[s]) for s in want}
    worst = max(rel, key=rel.get)
    falls = got[ctx.float8_steps] < got[1]
    ok = rel[worst] <= FLOAT8_REL_BOUND and falls
    last = ctx.float8_steps
    figure = (
        f"worst {rel[worst]:.2%} at step {worst}; loss {got[1]:.3f} -> {got[last]:.3f} "
        f"(reference {want[1]:.3f} -> {want[last]:.3f})"
    )
    return [result("b", name, "PASS" if ok else "FAIL", figure, bound)]


# ---------------------------------------------------------------------------------------------
# (c) async_with_pinned_mem save + exact resume, (d) deterministic twice


def check_resume_and_determinism(ctx: Context) -> list[dict]:
    args = [
        "--training.deterministic",
        "--training.steps",
        str(RESUME_STEPS),
        "--checkpoint.enable_checkpoint",
        "--checkpoint.interval",
        str(RESUME_AT),
        "--checkpoint.async_mode",
        "async_with_pinned_mem",
    ]
    full = ctx.train("c_full", *args)
    pinned = "using 'async'" not in full.stderr
    c_name = "async_with_pinned_mem save + exact resume" + (
        "" if pinned else " (no CUDA: the trainer fell back to 'async')"
    )
    c_bound = f"losses of steps {RESUME_AT + 1}-{RESUME_STEPS} bit-identical"
    d_name = f"training.deterministic on {'CUDA' if ctx.cuda else 'CPU'}: two identical runs"
    d_bound = f"all {RESUME_STEPS} losses bit-identical"
    if full.returncode != 0:
        why = f"uninterrupted run: {failure(full)}"
        return [
            result("c", c_name, "FAIL", why, c_bound),
            result("d", d_name, "FAIL", why, d_bound),
        ]
    want = losses(ctx.work / "c_full")
    resumed_dir = ctx.work / "c_resumed"
    src = ctx.work / "c_full" / "checkpoint" / f"step-{RESUME_AT}"
    # The repeat run (d) needs nothing from the resumed one (c): side by side.
    with ThreadPoolExecutor(1) as pool:
        repeat = pool.submit(ctx.train, "d_again", *args)
        if src.exists():
            shutil.copytree(src, resumed_dir / "checkpoint" / src.name)
            resumed = ctx.train("c_resumed", *args)
        again = repeat.result()
    if src.exists():
        got = losses(resumed_dir)
        if resumed.returncode != 0:
            c = result("c", c_name, "FAIL", f"resumed run: {failure(resumed)}", c_bound)
        elif f"resuming at step {RESUME_AT}" not in resumed.stderr:
            c = result("c", c_name, "FAIL", "the second run did not resume", c_bound)
        else:
            tail = range(RESUME_AT + 1, RESUME_STEPS + 1)
            same = [s for s in tail if s in got and got[s] == want.get(s)]
            diff = max((abs(got[s] - want[s]) for s in tail if s in got and s in want), default=0)
            ok = len(same) == len(tail) and sorted(got) == list(tail)
            c = result(
                "c",
                c_name,
                "PASS" if ok else "FAIL",
                f"{len(same)}/{len(tail)} steps identical; largest difference {diff:.3e}",
                c_bound,
            )
    else:
        c = result("c", c_name, "FAIL", f"no checkpoint at step {RESUME_AT}", c_bound)

    if again.returncode != 0:
        d = result("d", d_name, "FAIL", f"second run: {failure(again)}", d_bound)
    else:
        got = losses(ctx.work / "d_again")
        same = [s for s in want if got.get(s) == want[s]]
        diff = max((abs(got[s] - want[s]) for s in want if s in got), default=0)
        ok = len(same) == RESUME_STEPS == len(got)
        figure = f"{len(same)}/{RESUME_STEPS} steps identical; largest difference {diff:.3e}"
        d = result("d", d_name, "PASS" if ok else "FAIL", figure, d_bound)
    return [c, d]


# ---------------------------------------------------------------------------------------------
# (e) memory snapshot, (f) dry-run prediction vs the allocator's peak


def check_memory(ctx: Context) -> list[dict]:
    if ctx.smoke or ctx.cuda is None:
        shape = []  # the smoke-sized debug model
    else:
        shape = [
            "--model.dim",
            "1024",
            "--model.n_layers",
            "4",
            "--model.n_heads",
            "16",
            "--training.seq_len",
            "2048",
            "--training.local_batch_size",
            "4",
        ]
    steps = 3
    args = [
        *shape,
        "--training.mixed_precision_param",
        "float32" if ctx.smoke or ctx.cuda is None else "bfloat16",
        "--activation_checkpoint.mode",
        "none",
        "--training.steps",
        str(steps),
    ]
    e_name = "memory snapshot written (profiling.enable_memory_snapshot)"
    f_name = "dry-run total vs torch.cuda.max_memory_allocated"
    lo, hi = MEMORY_RATIO_BOUNDS
    f_bound = f"predicted / measured within [{lo}, {hi}]"
    dry = ctx.run(
        "f_dry_run",
        "titanlite.dry_run",
        [
            *ctx.base,
            *args,
            "--dry-run.world_size",
            "1",
            "--dry-run.device_type",
            "cuda" if ctx.cuda else "cpu",
            "--dry-run.device_memory_gib",
            f"{ctx.cuda['memory_gib'] if ctx.cuda else 80:.1f}",
        ],
    )
    match = re.search(r"^\s+total\s+([\d.]+) GiB of", dry.stdout, re.M)
    predicted = float(match.group(1)) if match else None
    if ctx.cuda is None:
        # The training run is left out: on CPU its memory_gib is the peak RSS, no comparison.
        why = "needs the CUDA caching allocator (no CUDA device here)"
        e = result("e", e_name, "SKIPPED", why, "a snapshot file that unpickles")
        if predicted is None:  # the dry run itself must still work
            f = result("f", f_name, "FAIL", f"dry run: {failure(dry)}", f_bound)
        else:
            f = result("f", f_name, "SKIPPED", f"{why}; predicted {predicted:.3f} GiB", f_bound)
        return [e, f]

    run = ctx.train(
        "ef_run",
        *args,
        "--profiling.enable_memory_snapshot",
        "--profiling.profile_freq",
        str(steps),
    )
    folder = ctx.work / "ef_run"
    snap = folder / "memory_snapshot" / f"iteration_{steps}" / "rank0_memory_snapshot.pickle"
    if run.returncode != 0:
        e = result("e", e_name, "FAIL", f"run: {failure(run)}", "a snapshot file that unpickles")
    elif not snap.exists():
        e = result("e", e_name, "FAIL", f"{snap.relative_to(ctx.work)} missing", "a snapshot file")
    else:
        try:
            with snap.open("rb") as fh:
                data = pickle.load(fh)
            n = len(data.get("segments", []))
            e = result(
                "e",
                e_name,
                "PASS" if n else "FAIL",
                f"{snap.stat().st_size / 2**20:.1f} MiB, {n} segments",
                "a snapshot file that unpickles, with segments",
            )
            if snap.stat().st_size < 64 * 2**20:
                shutil.copy(snap, ctx.out / snap.name)
        except Exception as exc:  # a broken file is the finding, whatever the exception
            e = result("e", e_name, "FAIL", f"unpickling: {exc!r}", "a snapshot that unpickles")
    measured = max((r.get("memory_gib", 0) for r in _rows(folder)), default=0)
    if predicted is None:
        f = result("f", f_name, "FAIL", f"dry run: {failure(dry)}", f_bound)
    elif not measured:
        f = result("f", f_name, "FAIL", f"run: {failure(run)}", f_bound)
    else:
        ratio = predicted / measured
        f = result(
            "f",
            f_name,
            "PASS" if lo <= ratio <= hi else "FAIL",
            f"predicted {predicted:.2f} GiB, measured {measured:.2f} GiB, ratio {ratio:.3f}",
            f_bound,
        )
    return [e, f]


def _rows(folder: Path) -> list[dict]:
    path = folder / "metrics.jsonl"
    return (
        [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    )


def print_per_parameter(rows: dict[str, dict]) -> None:
    print(f"(a) relative gradient error, compiled vs eager, per parameter ({len(rows)}):")
    for name, r in rows.items():
        rel = "missing" if r["rel"] is None else f"{r['rel']:.3e}"
        lost = "  LOST" if r["lost"] else ""
        print(f"    {name:<40} rel {rel}  |g| {r['eager_norm']:.4e}{lost}")


# ---------------------------------------------------------------------------------------------
# (g) the default block_causal kernel against masked SDPA


def check_attention(ctx: Context) -> list[dict]:
    dtype = "float32" if ctx.smoke or ctx.cuda is None else "bfloat16"
    common = ["--training.steps", str(ATTENTION_STEPS)]
    common += ["--training.mixed_precision_param", dtype, "--model.attn_mask_type", "block_causal"]
    with ThreadPoolExecutor(2) as pool:
        runs = {
            kind: pool.submit(ctx.train, f"g_{kind}", *common, "--model.attn_type", kind)
            for kind in ("auto", "sdpa")
        }
        procs = {kind: run.result() for kind, run in runs.items()}
    kernel = re.search(r"attention: block_causal through '(\w+)'", procs["auto"].stderr)
    name = (
        f"block_causal, attn_type 'auto' ({kernel[1] if kernel else '?'}) vs masked SDPA, {dtype}"
    )
    bound = f"all {ATTENTION_STEPS} losses within {ATTENTION_BOUND:g}"
    for kind, proc in procs.items():
        if proc.returncode != 0:
            return [result("g", name, "FAIL", f"{kind} run: {failure(proc)}", bound)]
    got, want = losses(ctx.work / "g_auto"), losses(ctx.work / "g_sdpa")
    steps = range(1, ATTENTION_STEPS + 1)
    if sorted(got) != list(steps) or sorted(want) != list(steps):
        return [result("g", name, "FAIL", "a run did not log every step", bound)]
    diff = max(abs(got[s] - want[s]) for s in steps)
    ok = diff <= ATTENTION_BOUND and kernel is not None and kernel[1] == "varlen"
    return [result("g", name, "PASS" if ok else "FAIL", f"largest difference {diff:.2e}", bound)]


# ---------------------------------------------------------------------------------------------
# (h) context parallel's pieces


def _cp_pieces_error(cp: int, seq: int, heads: tuple[int, int, int], device, dtype) -> float:
    """Worst relative error (in norm) of the outputs and of the q/k/v gradients summed over the
    simulated cp ranks, against float32 masked SDPA over the whole sequence."""
    import torch
    import torch.nn.functional as F

    from models.attention import attend, block_causal_mask, document_pieces
    from parallelisms.context_parallel import rank_positions

    g = torch.Generator().manual_seed(cp)
    n_q, n_kv, dim = heads
    tokens = torch.randint(2, 1000, (2, seq), generator=g)
    starts = torch.randint(0, seq, (2, 12), generator=g)
    tokens.scatter_(1, starts, 1)  # documents of very different lengths, across the borders
    tokens = tokens.to(device)
    shapes = [(2, n_q, seq, dim), (2, n_kv, seq, dim), (2, n_kv, seq, dim)]
    ref = [torch.randn(sh, generator=g).to(device).requires_grad_() for sh in shapes]
    grad_out = torch.randn(shapes[0], generator=g).to(device)
    mask = block_causal_mask(tokens, 1)
    want = F.scaled_dot_product_attention(*ref, attn_mask=mask, enable_gqa=True)
    want_grads = torch.autograd.grad(want, ref, grad_out)
    low = [t.detach().to(dtype).requires_grad_() for t in ref]
    keys = torch.cat([rank_positions(seq, cp, r, "headtail") for r in range(cp)]).to(device)
    errors, sums = [], [torch.zeros_like(t, dtype=torch.float32) for t in ref]
    for r in range(cp):
        mine = rank_positions(seq, cp, r, "headtail").to(device)
        pieces = document_pieces(tokens, 1, mine, keys)
        q, k, v = low[0][:, :, mine], low[1][:, :, keys], low[2][:, :, keys]
        got = attend(q, k, v, pieces)
        expected = want[:, :, mine]
        errors.append(((got.float() - expected).norm() / expected.norm()).item())
        for total, grad in zip(sums, torch.autograd.grad(got, low, grad_out[:, :, mine].to(dtype))):
            total += grad.float()
    for got, expected in zip(sums, want_grads):
        errors.append(((got - expected).norm() / expected.norm()).item())
    return max(errors)


def check_cp_pieces(ctx: Context) -> list[dict]:
    import torch

    on_gpu = not ctx.smoke and ctx.cuda is not None
    dtype = "bfloat16" if on_gpu else "float32"
    seq, heads = (4096, (32, 8, 128)) if on_gpu else (256, (4, 2, 16))
    bound = CP_PIECES_BOUND[dtype]
    name = f"context-parallel pieces vs float32 masked SDPA, {dtype}, seq {seq}, cp 2/4/8"
    try:
        worst = {
            cp: _cp_pieces_error(cp, seq, heads, "cuda" if on_gpu else "cpu", getattr(torch, dtype))
            for cp in (2, 4, 8)
        }
    except Exception as e:  # a kernel that refuses the inputs is this check's finding
        return [result("h", name, "FAIL", f"{type(e).__name__}: {e}"[:300], f"<= {bound:g}")]
    figure = ", ".join(f"cp {cp}: {err:.1e}" for cp, err in worst.items())
    ok = all(err <= bound for err in worst.values())  # a NaN fails
    return [result("h", name, "PASS" if ok else "FAIL", figure, f"every error <= {bound:g}")]


# ---------------------------------------------------------------------------------------------
# (i) one-rank FSDP2 + DTensor, (k) the float8 checkpoint without torchao: fresh processes

WORKERS = str(Path(__file__).resolve().parent / "gpu_check_workers.py")


def check_fsdp(ctx: Context) -> list[dict]:
    from gpu_check_workers import FSDP_BF16_LOSS_BOUND, FSDP_REL_BOUND

    out_json = ctx.work / "fsdp.json"
    proc = ctx.run("i_fsdp", WORKERS, ["fsdp", str(out_json), "--", *ctx.base])
    backend = "nccl" if ctx.cuda else "gloo"
    name = f"one-rank {backend} group: FSDP2 + DTensor steps vs the unsharded model"
    bound = f"losses, grad norms, parameters within {FSDP_REL_BOUND:g}; bf16 loss within "
    bound += f"{FSDP_BF16_LOSS_BOUND:g}"
    if proc.returncode != 0 or not out_json.exists():
        return [result("i", name, "FAIL", failure(proc), bound)]
    got = json.loads(out_json.read_text())
    ok = got["backend"] == backend and got["dtensors"] == got["params"] > 0
    ok = ok and got["step_rel"] <= FSDP_REL_BOUND and got["param_rel"] <= FSDP_REL_BOUND
    ok = ok and got["bf16_loss_rel"] <= FSDP_BF16_LOSS_BOUND  # NaN compares False: FAIL
    figure = (
        f"backend {got['backend']}, {got['dtensors']}/{got['params']} parameters DTensors; "
        f"worst step {got['step_rel']:.1e}, parameter {got['param_rel']:.1e}, "
        f"bf16 loss {got['bf16_loss_rel']:.1e}"
    )
    return [result("i", name, "PASS" if ok else "FAIL", figure, bound)]


def check_float8_checkpoint(ctx: Context) -> list[dict]:
    name = "float8 (FSDP float8 all-gather) checkpoint loads without torchao"
    bound = "plain tensors equal to the saved ones; a one-step run resumes from it"
    if importlib.util.find_spec("torchao") is None:
        return _no_torchao("k", name, bound)
    dump = ctx.work / "k_float8_checkpoint"
    dump.mkdir(parents=True, exist_ok=True)
    saved = ctx.run("k_save", WORKERS, ["float8-save", str(dump), "--", *ctx.base])
    if saved.returncode != 0 or not (dump / "saved.json").exists():
        return [result("k", name, "FAIL", f"save: {failure(saved)}", bound)]
    precision = ["--training.mixed_precision_param", "bfloat16" if ctx.on_gpu else "float32"]
    args = ["float8-load", str(dump), "--", *ctx.base, *precision]
    loaded = ctx.run("k_load", WORKERS, args)
    if loaded.returncode != 0 or not (dump / "loaded.json").exists():
        return [result("k", name, "FAIL", f"load: {failure(loaded)}", bound)]
    s, got = (
        json.loads((dump / "saved.json").read_text()),
        json.loads((dump / "loaded.json").read_text()),
    )
    resumed = got["resume_exit"] == 0 and "loaded model from" in loaded.stderr
    ok = "WeightWithDynamicFloat8CastTensor" in s["kinds"] and s["subclassed"] > 0
    ok = ok and got["plain_tensors"] and got["max_abs_diff"] == 0
    ok = ok and resumed and not got["torchao_imported"]
    step = "" if s["loss"] is None else f" after a float8 step (loss {s['loss']:.3f})"
    figure = (
        f"{s['tensors']} tensors, {s['subclassed']} saved as torchao weights{step}; "
        f"loaded as plain tensors: {got['plain_tensors']}, max |diff| {got['max_abs_diff']:g}; "
        f"{precision[1]} resume {'ran' if resumed else 'FAILED'}"
    )
    return [result("k", name, "PASS" if ok else "FAIL", figure, bound)]


# ---------------------------------------------------------------------------------------------
# (j) every block_causal kernel against an explicit float32 masked computation


def _explicit_attention(q, k, v, mask):
    """Scores, the boolean mask, softmax, values: nothing fused, float32."""
    rep = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(rep, dim=1) for t in (k, v))
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    return scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v


def _block_causal_tokens(seq: int, bos: int, generator):
    """Two windows: the first starts inside a document and holds documents of every length (a
    single-token one among them), the second is one document."""
    import torch

    tokens = torch.randint(bos + 1, 1000, (2, seq), generator=generator)
    cuts = sorted({seq // 7, seq // 3, seq // 3 + 1, seq // 2, seq - 1})
    tokens[0, cuts] = bos
    tokens[1, 0] = bos
    return tokens


def _block_causal_errors(seq: int, heads: tuple[int, int, int], device, dtype) -> dict:
    import torch

    from models.attention import (
        attend,
        block_causal_block_mask,
        block_causal_mask,
        documents,
    )

    g = torch.Generator().manual_seed(0)
    n_q, n_kv, dim = heads
    tokens = _block_causal_tokens(seq, 1, g).to(device)
    shapes = [(2, n_q, seq, dim), (2, n_kv, seq, dim), (2, n_kv, seq, dim)]
    ref = [torch.randn(sh, generator=g).to(device).requires_grad_() for sh in shapes]
    grad_out = torch.randn(shapes[0], generator=g).to(device)
    dense = block_causal_mask(tokens, 1)
    want = _explicit_attention(*ref, dense)
    want_grads = torch.autograd.grad(want, ref, grad_out)
    masks = {"varlen": documents(tokens, 1), "sdpa": dense}
    if device == "cuda":  # no FlexAttention backward on CPU
        masks["flex"] = block_causal_block_mask(tokens, 1)
    errors = {}
    for kernel, mask in masks.items():
        low = [t.detach().to(dtype).requires_grad_() for t in ref]
        got = attend(*low, mask)
        grads = torch.autograd.grad(got, low, grad_out.to(dtype))
        errors[kernel] = max(
            ((a.float() - b).norm() / b.norm()).item()
            for a, b in zip((got, *grads), (want, *want_grads))
        )
    return errors


def check_block_causal(ctx: Context) -> list[dict]:
    import torch

    dtype = "bfloat16" if ctx.on_gpu else "float32"
    seq, heads = (4096, (32, 8, 128)) if ctx.on_gpu else (256, (4, 2, 16))
    bound = CP_PIECES_BOUND[dtype]
    name = f"block_causal kernels vs explicit float32 masked attention, {dtype}, seq {seq}"
    try:
        device = "cuda" if ctx.on_gpu else "cpu"
        errors = _block_causal_errors(seq, heads, device, getattr(torch, dtype))
    except Exception as e:  # a kernel that refuses the inputs is this check's finding
        return [result("j", name, "FAIL", f"{type(e).__name__}: {e}"[:300], f"<= {bound:g}")]
    figure = ", ".join(f"{k} {err:.1e}" for k, err in errors.items())
    if "flex" not in errors:
        figure += " (flex: CUDA only)"
    ok = all(err <= bound for err in errors.values())  # a NaN fails
    bound = f"outputs and q/k/v gradients <= {bound:g} relative"
    return [result("j", name, "PASS" if ok else "FAIL", figure, bound)]


def _timed(check, ctx: Context) -> list[dict]:
    start = time.perf_counter()
    rows = check(ctx)
    for r in rows:
        r["seconds"] = round(time.perf_counter() - start, 1)
    return rows


CHECKS = {
    "a": check_grads,
    "b": check_float8,
    "cd": check_resume_and_determinism,
    "ef": check_memory,
    "g": check_attention,
    "h": check_cp_pieces,
    "i": check_fsdp,
    "j": check_block_causal,
    "k": check_float8_checkpoint,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--grads-worker"]:
        return grads_worker(Path(argv[1]), argv[3:])
    ap = ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CPU/gloo rehearsal in tiny sizes")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "gpu_check")
    ap.add_argument(
        "--only", default=",".join(CHECKS), help=f"groups to run (default all: {','.join(CHECKS)})"
    )
    ap.add_argument(
        "--timeout",
        type=int_arg(1, 30 * 24 * 3600),
        default=300,
        help="seconds per run before it fails",
    )
    ap.add_argument(
        "--jobs", type=int_arg(1, 1024), default=3, help="check groups run side by side"
    )
    ap.add_argument("--keep-runs", action="store_true", help="keep run folders under OUT/runs")
    args = ap.parse_args(argv)
    unknown = set(args.only.split(",")) - set(CHECKS)
    if unknown:
        ap.error(f"--only: unknown {sorted(unknown)}; known {sorted(CHECKS)}")

    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        work = args.out / "runs" if args.keep_runs else Path(tmp)
        ctx = Context(args.smoke, args.out, work, args.timeout)
        if ctx.cuda is None and not args.smoke:
            print("gpu_check: no CUDA device; use --smoke for the CPU rehearsal", file=sys.stderr)
            return USER_ERROR
        where = (
            f"{ctx.cuda['name']} (compute capability {ctx.cuda['capability']}, "
            f"{ctx.cuda['memory_gib']:.1f} GiB)"
            if ctx.cuda
            else f"CPU ({os.cpu_count()} cores), no CUDA"
        )
        print(f"gpu_check{' --smoke' if args.smoke else ''} on {where}, torch {torch.__version__}")
        # The groups are independent processes: side by side, the start-up of each (imports,
        # process group, compile) overlaps the others' training.
        with ThreadPoolExecutor(args.jobs) as pool:
            futures = [pool.submit(_timed, CHECKS[key], ctx) for key in args.only.split(",")]
            results = []
            for future in as_completed(futures):
                for r in future.result():
                    if "per_parameter" in r:
                        print_per_parameter(r["per_parameter"])
                    print(f"({r['check']}) {r['status']:<7} {r['name']}: {r['figure']}", flush=True)
                    results.append(r)
        results.sort(key=lambda r: r["check"])
    lines = [
        f"gpu_check{' --smoke' if args.smoke else ''}: {where}, torch {torch.__version__}, "
        f"{time.perf_counter() - start:.0f}s",
        "",
        "| check | status | what | figure | bound |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['check']} | {r['status']} | {r['name']} | {r['figure']} | {r['bound']} |"
        for r in results
    ]
    text = "\n".join(lines) + "\n"
    (args.out / "gpu_check.txt").write_text(text)
    summary = {
        "smoke": args.smoke,
        "device": ctx.cuda,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "seconds": round(time.perf_counter() - start, 1),
        "results": results,
    }
    (args.out / "gpu_check.json").write_text(json.dumps(summary, indent=1) + "\n")
    print("\n" + text + f"summary written to {args.out}/gpu_check.json and gpu_check.txt")
    return 1 if any(r["status"] == "FAIL" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
