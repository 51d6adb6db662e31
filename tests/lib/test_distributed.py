"""Lesson 14's engines proven equal to one process, the launcher's clean-up, and the torchrun command.

Every process these tests start must have ended when they return: the launcher's ranks, torchrun and
its workers. An autouse fixture checks that no child process and no listening socket of this process
remain after each test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

from course_lib.attention import MultiHeadAttention
from course_lib.launch import RankFailed, RanksTimedOut, run_on_ranks
from course_lib.layers import FeedForward
from course_lib.masks import causal_mask
from course_lib.parallel import (
    ParallelMLP, ParallelSelfAttention, accumulate_gradients, ddp_bucket_timeline, fsdp_expected_bytes,
    random_batches, tiny_gpt, train_one_process, train_replica,
)
from course_lib.gpt import lm_loss

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.long  # about 3 minutes on 2 busy cores: scheduled first


def _listening(proc: psutil.Process) -> list:
    return [c for c in proc.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]


@pytest.fixture(autouse=True)
def nothing_left():
    yield
    me = psutil.Process()
    assert me.children(recursive=True) == [], "a process started by the test is still running"
    assert _listening(me) == [], "a port is still bound"


# --- the launcher ------------------------------------------------------------------------------

def _sum_ranks(rank, world_size, offset):
    t = torch.tensor([float(rank + offset)])
    dist.all_reduce(t)
    return {"rank": rank, "sum": t.item(), "world": dist.get_world_size()}


def test_run_on_ranks_returns_each_rank_result_in_order():
    out = run_on_ranks(_sum_ranks, 3, (10,), timeout=60)
    assert [r["rank"] for r in out] == [0, 1, 2]
    assert all(r["sum"] == 33.0 and r["world"] == 3 for r in out)


def _fails_on_1(rank, world_size):
    if rank == 1:
        raise ValueError("bad input on rank 1")
    t = torch.zeros(1)
    dist.all_reduce(t)  # rank 0 would wait here for ever without the launcher
    return t


def test_a_failing_rank_is_named_and_the_others_are_stopped():
    with pytest.raises(RankFailed, match="rank 1 raised ValueError: bad input on rank 1"):
        run_on_ranks(_fails_on_1, 2, timeout=60)


def _spin(rank, world_size):
    while True:
        pass


def test_a_hang_is_stopped_at_the_time_limit():
    with pytest.raises(RanksTimedOut, match="did not finish within 2 s"):
        run_on_ranks(_spin, 2, timeout=2)


def _exits(rank, world_size):
    if rank == 0:
        os._exit(3)  # a crash without a Python error (a segfault, the OOM killer)
    t = torch.zeros(1)
    dist.all_reduce(t)
    return t


def test_a_rank_that_dies_does_not_hang_the_others():
    with pytest.raises(RankFailed, match="exit code 3|never reached"):
        run_on_ranks(_exits, 2, timeout=60)


def test_bad_arguments_get_clear_errors():
    with pytest.raises(ValueError, match="world_size must be an int >= 1"):
        run_on_ranks(_sum_ranks, 0)
    with pytest.raises(TypeError, match="must be a function"):
        run_on_ranks(42, 2)


def test_spawn_runs_a_function_defined_in_the_main_module(tmp_path):
    """Where fork is not used (macOS, Windows), a notebook's function is written to a module."""
    script = tmp_path / "main.py"
    script.write_text(textwrap.dedent('''
        import torch, torch.distributed as dist
        from course_lib.launch import run_on_ranks

        def doubled(rank, world_size, scale):
            t = torch.tensor([float(rank + 1)])
            dist.all_reduce(t)
            return t.item() * scale

        if __name__ == "__main__":
            print(run_on_ranks(doubled, 2, (2.0,), timeout=120, start_method="spawn"))
    '''))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[6.0, 6.0]"


# --- each engine equals one process -------------------------------------------------------------

def test_gradient_accumulation_equals_one_big_batch_and_the_mistake_is_k_times():
    x, y = random_batches(1, 12)[0]
    big = tiny_gpt(0)
    lm_loss(big(x), y).backward()
    for k in (1, 2, 3, 4):
        model = tiny_gpt(0)
        accumulate_gradients(model, lm_loss, x, y, k)
        diff = max((p.grad - q.grad).abs().max().item() for p, q in zip(model.parameters(), big.parameters()))
        assert diff <= 1e-12, (k, diff)
    model = tiny_gpt(0)  # the mistake: each micro-batch's loss not divided by k
    for xs, ys in zip(x.chunk(3), y.chunk(3)):
        lm_loss(model(xs), ys).backward()
    assert all(torch.allclose(p.grad, 3 * q.grad, atol=1e-12) for p, q in zip(model.parameters(), big.parameters()))
    with pytest.raises(ValueError, match="dividing the batch size"):
        accumulate_gradients(model, lm_loss, x, y, 5)


@pytest.fixture(scope="module")
def reference():
    batches = random_batches(4, 8, seed=3)
    return batches, train_one_process(batches)


@pytest.mark.parametrize("engine", ["hand", "ddp", "zero1", "fsdp"])
def test_engine_equals_one_process(engine, reference):
    batches, ref = reference
    results = run_on_ranks(train_replica, 2, (engine, batches), timeout=120)
    for r in results:
        grad_diff = max((r["grads"][n] - ref["grads"][n]).abs().max().item() for n in ref["grads"])
        weight_diff = max((r["weights"][n] - ref["weights"][n]).abs().max().item() for n in ref["weights"])
        assert grad_diff <= 1e-12, grad_diff  # float64: the averaged gradient is one process's
        assert weight_diff <= 1e-12, weight_diff  # after 4 AdamW steps
        assert max(abs(a - b) for a, b in zip(r["losses"], ref["losses"])) <= 1e-12
    whole = ref["optimizer_bytes"]
    numbers = sum(p.numel() for p in tiny_gpt(0).parameters())
    assert whole == 2 * 8 * numbers  # two float64 moments per weight
    for rank, r in enumerate(results):
        if engine == "zero1":
            assert r["bytes"]["optimizer"] == whole // 2  # 28,128 weights split evenly
            assert r["bytes"]["parameters"] == 8 * numbers
        elif engine == "fsdp":
            assert r["bytes"] == fsdp_expected_bytes(tiny_gpt(0), rank, 2)
            assert r["bytes"]["parameters"] < 8 * numbers * 0.51
        else:
            assert r["bytes"]["optimizer"] == whole


def test_ddp_equals_the_hand_made_version():
    batches = random_batches(3, 8, seed=4)
    hand = run_on_ranks(train_replica, 2, ("hand", batches), timeout=120)
    ddp = run_on_ranks(train_replica, 2, ("ddp", batches), timeout=120)
    for h, d in zip(hand, ddp):
        assert max((h["weights"][n] - d["weights"][n]).abs().max().item() for n in h["weights"]) <= 1e-12


def test_ddp_sends_buckets_during_backward():
    small = run_on_ranks(ddp_bucket_timeline, 2, (0.25,), timeout=120)[0]
    large = run_on_ranks(ddp_bucket_timeline, 2, (25.0,), timeout=120)[0]
    assert len(large["buckets"]) == 1 and len(small["buckets"]) >= 3
    total = sum(p.numel() for p in tiny_gpt(0, d_model=128, max_len=64).parameters())
    assert sum(n for _, n in small["buckets"]) == total == sum(n for _, n in large["buckets"])
    first_sent, _ = small["buckets"][0]
    assert first_sent < small["backward_ms"]  # the first bucket left while backward was running


def _mlp_rank(rank, world_size, seed):
    torch.manual_seed(seed)
    dense = FeedForward(16, 24, dropout=0.0, activation="gelu").double()
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    out = ParallelMLP(dense, rank, world_size)(x)
    out.square().sum().backward()
    return out.detach(), x.grad


@pytest.mark.parametrize("world", [2, 4])
def test_megatron_mlp_equals_the_dense_feed_forward(world):
    torch.manual_seed(7)
    dense = FeedForward(16, 24, dropout=0.0, activation="gelu").double()
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    expected = dense(x)
    expected.square().sum().backward()
    for out, grad in run_on_ranks(_mlp_rank, world, (7,), timeout=120):
        assert (out - expected.detach()).abs().max() <= 1e-12
        assert (grad - x.grad).abs().max() <= 1e-12


def _dense_attention(kv_heads, rotary, seed):
    """A float64 MultiHeadAttention (d_model 24, 4 heads of 6), its input (2, 5, 24), a causal mask
    (per head and thinned at random when ``seed`` is odd) and an output gradient, all from ``seed``."""
    from course_lib.rope import RotaryEmbedding

    torch.manual_seed(seed)
    rope = RotaryEmbedding(6, 16) if rotary else None
    dense = MultiHeadAttention(24, 4, num_kv_heads=kv_heads, rotary=rope).double()
    x = torch.randn(2, 5, 24, dtype=torch.float64)
    mask = causal_mask(5)  # (T, T)
    if seed % 2:  # (B, H, T, T): each head its own mask; the diagonal stays visible
        mask = mask & ((torch.rand(2, 4, 5, 5) < 0.7) | torch.eye(5, dtype=torch.bool))
    return dense, x, mask, torch.randn(2, 5, 24, dtype=torch.float64)


_COUNTED = ("all_reduce", "all_gather", "broadcast", "reduce_scatter", "all_to_all")


def _attention_rank(rank, world_size, kv_heads, rotary, seed):
    dense, x, mask, g = _dense_attention(kv_heads, rotary, seed)
    x.requires_grad_(True)
    counts, phase = {}, ["build"]

    def counted(name, original):
        def wrapper(*args, **kwargs):
            counts[(phase[0], name)] = counts.get((phase[0], name), 0) + 1
            return original(*args, **kwargs)
        return wrapper

    originals = {name: getattr(dist, name) for name in _COUNTED}
    for name, original in originals.items():
        setattr(dist, name, counted(name, original))
    try:
        module = ParallelSelfAttention(dense, rank, world_size)
        phase[0] = "forward"
        out = module(x, mask)
        phase[0] = "backward"
        out.backward(g)
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
    grads = {n.removeprefix("attention."): p.grad for n, p in module.named_parameters()}
    return out.detach(), x.grad, grads, counts


@pytest.mark.parametrize("world, kv_heads, rotary, seed", [
    (2, None, False, 0), (2, None, True, 1), (4, None, False, 1), (2, 2, True, 0), (4, 4, False, 2),
])
def test_attention_split_by_heads_equals_the_dense_attention(world, kv_heads, rotary, seed):
    """Forward, input gradient and every weight's gradient (the ranks' shares put back together)
    equal the dense module's in float64; one all-reduce forward, one backward, nothing else."""
    dense, x, mask, g = _dense_attention(kv_heads, rotary, seed)
    x.requires_grad_(True)
    expected = dense(x, x, x, mask)
    expected.backward(g)
    results = run_on_ranks(_attention_rank, world, (kv_heads, rotary, seed), timeout=120)
    for out, x_grad, _, counts in results:
        assert (out - expected.detach()).abs().max() <= 1e-12
        assert (x_grad - x.grad).abs().max() <= 1e-12
        assert counts == {("forward", "all_reduce"): 1, ("backward", "all_reduce"): 1}, counts
    for name, p in dense.named_parameters():
        shares = [r[2][name] for r in results]
        if name == "out_proj.bias":  # added once, after g: every rank holds the whole of it
            whole = shares[0]
            assert all(torch.equal(s, whole) for s in shares)
        else:  # Q, K, V split by output features (rows), out_proj by input features (columns)
            whole = torch.cat(shares, dim=1 if name == "out_proj.weight" else 0)
        assert whole.shape == p.shape and (whole - p.grad).abs().max() <= 1e-12, name


def test_attention_heads_that_do_not_split_are_refused():
    with pytest.raises(ValueError, match="6 query heads and 6 key/value heads must both divide by "
                                         "the world size 4"):
        ParallelSelfAttention(MultiHeadAttention(24, 6), 0, 4)
    with pytest.raises(ValueError, match="4 query heads and 2 key/value heads .* world size 4"):
        ParallelSelfAttention(MultiHeadAttention(24, 4, num_kv_heads=2), 0, 4)  # KV groups split
    with pytest.raises(TypeError, match="MultiHeadAttention"):
        ParallelSelfAttention(FeedForward(24, 48), 0, 2)


# --- the torchrun command -----------------------------------------------------------------------

def test_torchrun_on_two_processes_equals_one_process_and_ends_everything(tmp_path):
    marker = uuid.uuid4().hex
    common = ["-m", "course_lib.train_ddp", "--steps", "6", "--batch-size", "8", "--block-size", "32",
              "--log-every", "5", "--threads", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COURSE_TEST_MARKER": marker}
    one = subprocess.run([sys.executable, *common, "--out", str(tmp_path / "one.json")], env=env,
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert one.returncode == 0, one.stderr
    torchrun = Path(sys.executable).with_name("torchrun")
    two = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", *common, "--out",
                          str(tmp_path / "two.json")], env=env, capture_output=True, text=True,
                         timeout=600, cwd=ROOT)
    assert two.returncode == 0, two.stderr
    assert "DDP: 2 process(es)" in two.stdout and "throughput:" in two.stdout
    a = json.loads((tmp_path / "one.json").read_text())
    b = json.loads((tmp_path / "two.json").read_text())
    assert len(a["losses"]) == len(b["losses"]) == 6
    assert max(abs(x - y) for x, y in zip(a["losses"], b["losses"])) <= 1e-4  # float32 rounding
    left = [p for p in psutil.process_iter(["environ"])
            if (p.info.get("environ") or {}).get("COURSE_TEST_MARKER") == marker]
    assert left == [], f"torchrun left {left}"


def test_ddp_benchmark_prints_its_two_lines(monkeypatch, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_ddp", ROOT / "benchmarks" / "ddp.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    # Alternating runs: one noisy pair (the 3rd) must not move the medians.
    speeds = {1: iter([1000.0, 1010.0, 500.0, 990.0, 1000.0] * 2), 2: iter([1800.0, 1790.0, 1810.0, 3000.0, 1800.0] * 2)}
    calls = []

    def fake(n, threads, batch_size, steps, folder):
        calls.append((n, batch_size, steps))
        return {"tokens_per_s": next(speeds[n]), "losses": [4.4, 3.0 + (n - 1) * 1e-6]}

    monkeypatch.setattr(bench, "throughput", fake)
    bench.main(["--processes", "2", "--batch-sizes", "64", "32", "--repeats", "5", "--tokens", "8192"])
    lines = capsys.readouterr().out.splitlines()
    assert [n for n, _, _ in calls] == [1, 2] * 10  # alternating, each side 5 times per batch size
    assert [(b, s) for _, b, s in calls[:2]] == [(64, 20), (64, 20)]  # at least 20 steps a run
    assert lines[0].startswith("ddp: 2 processes x ") and "1,800 tokens/s vs 1,000 for one (efficiency 0.90)" in lines[0]
    gap = float(lines[0].rsplit("within ", 1)[1])
    assert gap <= 1e-15
    assert lines[1].startswith("bytes per rank") and "ZeRO-1 225/225" in lines[1] and "FSDP 113/112" in lines[1]
    assert lines[2].startswith("(global batch 64 x 64: efficiency 0.90, medians of 5") and "1.0e-06" in lines[2]
    assert lines[3].startswith("(global batch 32 x 64: efficiency 0.90") and "0.89-1.81" in lines[3]


def test_run_command_ends_torchrun_and_its_workers_on_a_time_out(tmp_path):
    from course_lib.launch import run_command

    marker = uuid.uuid4().hex
    script = tmp_path / "sleeper.py"
    script.write_text(f"import time\nMARKER = '{marker}'\ntime.sleep(600)\n")
    with pytest.raises(RanksTimedOut, match="did not finish within 20 s"):
        run_command([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                     str(script)], timeout=20)
    left = [p for p in psutil.process_iter(["cmdline"]) if str(script) in " ".join(p.info["cmdline"] or [])]
    assert left == [], f"left running: {left}"


def test_stored_precision_runs_and_checkpointing():
    from course_lib.parallel import load_precision_runs

    stored = load_precision_runs()
    for seed in range(3):
        f32, bf16 = stored["runs"][f"float32/{seed}"], stored["runs"][f"bf16/{seed}"]
        assert len(f32["losses"]) == len(bf16["losses"]) == stored["steps"]
        assert abs(f32["losses"][-1] - bf16["losses"][-1]) < 0.1
        assert f32["losses"][0] == pytest.approx(bf16["losses"][0], abs=0.01)
    model = tiny_gpt(0, torch.float32, d_model=64, max_len=32, num_layers=3)
    ids = torch.randint(0, 67, (4, 33), generator=torch.Generator().manual_seed(0))
    from course_lib.parallel import saved_activation_bytes

    plain, checkpointed = saved_activation_bytes(model, ids, False), saved_activation_bytes(model, ids, True)
    assert checkpointed < 0.25 * plain
