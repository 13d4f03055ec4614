"""torch.profiler around tpu work (docs/profiler.md): the core's compiles,
launches and transfers on the host's threads, the programs and copies on a
"tpu:0" row, in the exported Chrome trace and in key_averages(); nothing is
recorded while no profile runs."""

import json
import math
import time

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import torchtpu
from torchtpu import _native

pytestmark = pytest.mark.skipif(
    not _native.PROFILER, reason="torchtpu._device_guard built without Kineto's headers: no profiler session"
)

PHASES = {"X", "B", "E", "i", "I", "M", "s", "t", "f", "C", "b", "n", "e"}


def _load(prof, tmp_path):
    """The exported trace, checked as trace-event JSON (what Perfetto and
    chrome://tracing read): finite numbers, a phase, a name and ids."""
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))

    def refuse(c):
        raise ValueError(f"non-finite number {c} in the trace")

    trace = json.loads(path.read_text(), parse_constant=refuse)
    events = trace["traceEvents"]
    assert isinstance(events, list) and events
    for e in events:
        assert e["ph"] in PHASES, e
        assert isinstance(e["name"], str) and isinstance(e.get("pid"), (int, str)), e
        if e["ph"] == "X":
            assert isinstance(e["ts"], (int, float)) and math.isfinite(e["ts"]), e
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            assert isinstance(e["tid"], (int, str)), e
    return trace


def _ns(trace, e):
    """An event's start and end in ns of the wall clock (its ts, in us, counts
    from the trace's baseTimeNanoseconds)."""
    t0 = trace.get("baseTimeNanoseconds", 0) + round(e["ts"] * 1000)
    return t0, t0 + round(e["dur"] * 1000)


def _by_cat(trace, cat):
    return [e for e in trace["traceEvents"] if e.get("cat") == cat and e["ph"] == "X"]


def _device_pid(trace, index=0):
    """The pid of the "tpu:<index>" row's process, with its thread row named so."""
    names = {
        (e["pid"], e["name"]): e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] in ("process_name", "thread_name")
    }
    pids = [pid for (pid, kind), name in names.items() if kind == "process_name" and name == f"tpu:{index}"]
    assert len(pids) == 1, names
    assert names.get((pids[0], "thread_name")) == f"tpu:{index}"
    return pids[0]


def _train_step(mode, n_in, n_out, batch):
    """A Linear + MSE loss, backward and an SGD step; shapes of its own, so
    that its programs are compiled inside the profile."""
    torch.manual_seed(0)
    model = torch.nn.Linear(n_in, n_out).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(batch, n_in).to("tpu")
    y = torch.randn(batch, n_out)
    torch.tpu.synchronize()
    with torchtpu.eager_mode(mode):
        start = time.time_ns()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
            target = y.to("tpu")  # an upload of batch * n_out floats
            loss = ((model(x) - target) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            weight = model.weight.cpu()  # a download of n_out * n_in floats
        end = time.time_ns()
    assert weight.shape == (n_out, n_in)
    return prof, start, end


@pytest.mark.parametrize("mode, shape", [("fused", (13, 7, 11)), ("strict", (17, 5, 9))])
def test_training_step_trace(tmp_path, mode, shape):
    n_in, n_out, batch = shape
    prof, start, end = _train_step(mode, n_in, n_out, batch)
    trace = _load(prof, tmp_path)
    host = _by_cat(trace, "privateuse1_runtime")
    kernels = _by_cat(trace, "kernel")
    copies = _by_cat(trace, "gpu_memcpy")
    pid = _device_pid(trace)
    names = [e["name"] for e in host]

    # compiles, named by what they compile
    compiles = [n for n in names if n.startswith("tpu::compile ")]
    if mode == "fused":
        assert any(n.startswith("tpu::compile fused program of ") and n.endswith(" ops") for n in compiles), names
    else:
        assert "tpu::compile aten::addmm" in compiles and "tpu::compile aten::mm" in compiles, names

    # programs on the device row, inside the profile, each after its launch
    assert kernels and all(e["pid"] == pid and e["tid"] == 0 for e in kernels + copies)
    launches = {e["args"]["correlation"]: e for e in host if e["name"].startswith("tpu::launch ")}
    for k in kernels:
        k0, k1 = _ns(trace, k)
        assert k["dur"] > 0 and start <= k0 < k1 <= end, (k, start, end)
        launch = launches[k["args"]["correlation"]]
        assert launch["name"] == "tpu::launch " + k["name"]
        assert _ns(trace, launch)[0] <= k0
        assert launch["args"].get("External id") == k["args"].get("External id")  # the op that ran it
    if mode == "fused":
        assert any(k["name"].startswith("fused program of ") for k in kernels)
    else:
        assert {"aten::addmm", "aten::mm", "aten::mean"} <= {k["name"] for k in kernels}
    ops = {e["args"].get("External id") for e in _by_cat(trace, "cpu_op")}
    linked = [launch["args"]["External id"] for launch in launches.values() if "External id" in launch["args"]]
    assert linked and set(linked) <= ops
    flows = [e for e in trace["traceEvents"] if e.get("cat") == "ac2g" and e["ph"] in "sf"]
    assert {e["id"] for e in flows if e["ph"] == "f"} >= {k["args"]["correlation"] for k in kernels}

    # transfers, host and device, with their bytes
    up, down = 4 * batch * n_out, 4 * n_out * n_in
    for name, row, nbytes in (("tpu::upload", "Memcpy HtoD (tpu)", up), ("tpu::download", "Memcpy DtoH (tpu)", down)):
        assert any(e["name"] == name and e["args"]["bytes"] == nbytes for e in host), (name, nbytes)
        assert any(e["name"] == row and e["args"]["bytes"] == nbytes for e in copies), (row, nbytes)

    # key_averages: the host's activities with CPU time, the device's with device time
    avg = {e.key: e for e in prof.key_averages()}
    launch_keys = [k for k in avg if k.startswith("tpu::launch ")]
    assert launch_keys and all(avg[k].cpu_time_total > 0 for k in launch_keys)
    assert avg["tpu::upload"].count >= 1 and avg["tpu::download"].count >= 1
    assert any(avg[k["name"]].self_device_time_total > 0 for k in kernels)


def test_nothing_recorded_without_a_profile():
    before = torchtpu.metrics()["profiler_records"]
    x = torch.randn(6, 3).to("tpu")
    for mode in ("debug", "strict", "fused"):
        with torchtpu.eager_mode(mode):
            (x * 3 + 1).sum().cpu()
    assert torchtpu.metrics()["profiler_records"] == before
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]):
        (x * 3 + 1).sum().cpu()
    during = torchtpu.metrics()["profiler_records"]
    assert during > before
    (x * 5).sum().cpu()  # after the profile: nothing more
    assert torchtpu.metrics()["profiler_records"] == during


def test_cpu_only_profile(tmp_path):
    """ProfilerActivity.CPU alone: the host's activities (compiles, launches,
    transfers), no device row, as with CUDA; each profile has its own."""
    x = torch.randn(5, 19).to("tpu")
    with torchtpu.eager_mode("strict"):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            (x.exp() * 2).cpu()
        first = _load(prof, tmp_path)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            x.cos().cpu()
        second = _load(prof, tmp_path)
    names = [e["name"] for e in _by_cat(first, "privateuse1_runtime")]
    assert "tpu::launch aten::exp" in names and "tpu::download" in names
    assert not _by_cat(first, "kernel") and not _by_cat(first, "gpu_memcpy")
    names = [e["name"] for e in _by_cat(second, "privateuse1_runtime")]
    assert "tpu::launch aten::cos" in names and "tpu::launch aten::exp" not in names
