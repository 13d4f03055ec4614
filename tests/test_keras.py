"""Keras 3 with its torch backend on tpu (KERAS_BACKEND=torch, KERAS_TORCH_DEVICE=tpu): a functional
model (Concatenate, Add) and a Sequential CNN (Conv2D, BatchNormalization, MaxPooling2D) fit with Adam
and give the same per-epoch losses, predictions and evaluation as the same program on CPU; jit_compile=True
(a plain torch.compile in Keras's trainer) compiles with torchtpu's backend, not Inductor, and matches CPU;
the weights live on the tpu; seeded initializers and seeded random ops (torch.Generator(device="tpu")
underneath) are reproducible; keras.ops.image.affine_transform (under RandomRotation, RandomZoom and
RandomTranslation) matches CPU. (keras.random's gamma, binomial and beta are not tested: their samplers,
aten::_standard_gamma, aten::binomial and aten::_sample_dirichlet, are not lowered yet.)

Keras reads its backend and device from the environment when it is imported, so each program runs in a
child process (this process never imports Keras). The three children start together: the tpu cases, the
jit_compile case (Dynamo tracing Keras's train_step takes most of this file's time, so it runs beside
the others) and the CPU reference. The random streams of tpu and CPU differ (as CUDA's do), so the
models compared with CPU get their kernels from a seeded numpy generator; biases and BatchNorm
parameters keep their constant initial values. Nothing is downloaded. Keras is a test requirement
(make setup installs it): without it this file fails, it does not skip."""

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

TIMEOUT = 600

# Every child runs the cases named in its first argument and prints one line, "KERAS_RESULT <json>":
# {case: result} for the cases that ran, "errors": {case: traceback} for those that raised, and
# "metrics": torchtpu's counters at the end (on tpu).
CHILD = textwrap.dedent('''
    import json, os, sys, traceback

    import numpy as np
    import keras
    import torch

    DEVICE = os.environ["KERAS_TORCH_DEVICE"]
    out = {"errors": {}}

    rng = np.random.default_rng(0)
    X = rng.standard_normal((64, 8)).astype("float32")
    Y = np.stack([np.sin(X[:, 0] + X[:, 1]), X[:, 2] * X[:, 3]], 1).astype("float32")


    def numpy_kernels(model, seed):
        """The same initial weights on every device: kernels from numpy, the rest as built."""
        r = np.random.default_rng(seed)
        weights = []
        for w in model.get_weights():
            if w.ndim >= 2:
                w = (r.standard_normal(w.shape) / np.sqrt(np.prod(w.shape[:-1]))).astype("float32")
            weights.append(w)
        model.set_weights(weights)


    def functional():
        inp = keras.Input((8,))
        a = keras.layers.Dense(16, activation="relu")(inp)
        b = keras.layers.Dense(16, activation="tanh")(inp)
        h = keras.layers.Concatenate()([a, keras.layers.Add()([a, b])])
        return keras.Model(inp, keras.layers.Dense(2)(h))


    def mlp():
        model = functional()
        numpy_kernels(model, 1)
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
        hist = model.fit(X, Y, epochs=3, batch_size=16, shuffle=False, verbose=0)
        return {
            "loss": hist.history["loss"],
            "devices": sorted({str(w.value.device) for w in model.weights}),
            "predict": model.predict(X[:8], verbose=0).tolist(),
            "evaluate": model.evaluate(X, Y, batch_size=32, verbose=0),
        }


    def cnn():
        r = np.random.default_rng(2)
        x = r.standard_normal((32, 8, 8, 1)).astype("float32")
        y = (x[:, :4].mean((1, 2, 3)) > x[:, 4:].mean((1, 2, 3))).astype("int32")
        model = keras.Sequential(
            [
                keras.Input((8, 8, 1)),
                keras.layers.Conv2D(4, 3, padding="same", activation="relu"),
                keras.layers.BatchNormalization(),
                keras.layers.MaxPooling2D(2),
                keras.layers.Flatten(),
                keras.layers.Dense(2, activation="softmax"),
            ]
        )
        numpy_kernels(model, 2)
        model.compile(
            optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy", metrics=["accuracy"]
        )
        hist = model.fit(x, y, epochs=2, batch_size=8, shuffle=False, verbose=0)
        bn = model.layers[1]
        return {
            "loss": hist.history["loss"],
            "accuracy": hist.history["accuracy"],
            "moving_mean": bn.moving_mean.numpy().tolist(),
            "moving_variance": bn.moving_variance.numpy().tolist(),
            "devices": sorted({str(w.value.device) for w in model.weights}),
        }


    def tiny(jit):
        inp = keras.Input((8,))
        model = keras.Model(inp, keras.layers.Dense(2)(keras.layers.Dense(16, activation="tanh")(inp)))
        numpy_kernels(model, 3)
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", jit_compile=jit)
        hist = model.fit(X, Y, epochs=2, batch_size=16, shuffle=False, verbose=0)
        return {"loss": hist.history["loss"], "devices": sorted({str(w.value.device) for w in model.weights})}


    def jit():
        # Keras's trainer calls torch.compile(fn) with no backend=: on tpu tensors torchtpu's backend
        # must compile the graphs, and Inductor none
        import torch._inductor.compile_fx as inductor

        import torchtpu
        import torchtpu._dynamo as tpu_dynamo

        calls = {"tpu": 0, "inductor": 0}
        tpu_backend, compile_fx = tpu_dynamo.backend, inductor.compile_fx

        def counted_tpu(*a, **k):
            calls["tpu"] += 1
            return tpu_backend(*a, **k)

        def counted_inductor(*a, **k):
            calls["inductor"] += 1
            return compile_fx(*a, **k)

        tpu_dynamo.backend, inductor.compile_fx = counted_tpu, counted_inductor
        replays = torchtpu.metrics()["graph_replays"]
        res = tiny(True)
        res.update(calls=calls, graph_replays=torchtpu.metrics()["graph_replays"] - replays)
        return res


    def seeded():
        def weights(seed):
            keras.utils.set_random_seed(seed)
            model = functional()
            return [w.value for w in model.weights]

        first, again, other = weights(7), weights(7), weights(8)
        kernel = first[0].detach().cpu().numpy()  # Dense(16) of 8 inputs, GlorotUniform: U(-limit, limit)
        limit = float(np.sqrt(6 / (8 + 16)))
        keras.utils.set_random_seed(7)
        ones = keras.ops.ones((64, 64))
        drops = [keras.random.dropout(ones, 0.5, seed=keras.random.SeedGenerator(3)) for _ in range(2)]
        normals = [keras.random.normal((1000,), seed=11) for _ in range(2)]
        return {
            "devices": sorted({str(w.device) for w in first + [drops[0], normals[0]]}),
            "same": all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(first, again)),
            "other_differs": any(not torch.equal(a.cpu(), b.cpu()) for a, b in zip(first, other) if a.any()),
            "kernel_in_limit": bool(np.abs(kernel).max() <= limit),
            "kernel_std_ratio": float(kernel.std() / (limit / np.sqrt(3))),
            "dropout_same": bool(torch.equal(drops[0].cpu(), drops[1].cpu())),
            "dropout_kept": float((drops[0] != 0).float().mean()),
            "normal_same": bool(torch.equal(normals[0].cpu(), normals[1].cpu())),
            "normal_mean_std": [float(normals[0].mean()), float(normals[0].std())],
        }


    def image():
        # affine_transform (RandomRotation, RandomZoom and RandomTranslation call it) tiles a 5-dim grid
        # of indices over the batch: torch.tile of a 5-dim tensor
        r = np.random.default_rng(4)
        images = r.random((2, 8, 8, 3)).astype("float32")
        transforms = np.array([[0.9, -0.2, 1.0, 0.3, 1.1, -0.5, 0.01, 0.0], [1, 0, 0, 0, 1, 0, 0, 0]], "float32")
        res = {}
        for mode in ("bilinear", "nearest"):
            try:
                out = keras.ops.image.affine_transform(images, transforms, interpolation=mode)
                res[mode] = keras.ops.convert_to_numpy(out).tolist()
            except Exception as e:
                res[mode] = f"{type(e).__name__}: {e}"
        keras.utils.set_random_seed(5)
        for layer in (
            keras.layers.RandomRotation(0.2, seed=1),
            keras.layers.RandomZoom(0.2, seed=1),
            keras.layers.RandomTranslation(0.1, 0.1, seed=1),
        ):
            try:
                out = layer(images, training=True)
                res[type(layer).__name__] = [str(out.device), list(out.shape)]
            except Exception as e:
                res[type(layer).__name__] = f"{type(e).__name__}: {e}"
        return res

    CASES = {
        "mlp": mlp,
        "cnn": cnn,
        "jit": jit,
        "tiny": lambda: tiny(False),
        "seeded": seeded,
        "image": image,
    }
    for name in sys.argv[1].split(","):
        try:
            out[name] = CASES[name]()
        except BaseException:
            out["errors"][name] = traceback.format_exc()
    out["backend"] = keras.backend.backend()
    if DEVICE == "tpu":
        import torchtpu

        out["metrics"] = torchtpu.metrics()
    print("KERAS_RESULT " + json.dumps(out), flush=True)
''')

# name: (KERAS_TORCH_DEVICE, the cases it runs)
CHILDREN = {
    "tpu": ("tpu", "mlp,cnn,seeded,image"),
    "tpu_jit": ("tpu", "jit"),
    "cpu": ("cpu", "mlp,cnn,tiny,image"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Starts every child at once and waits for them: {child: its results}."""
    home = tmp_path_factory.mktemp("keras_home")  # Keras writes its keras.json there, not in ~/.keras
    procs = {}
    for name, (device, cases) in CHILDREN.items():
        env = dict(os.environ, KERAS_BACKEND="torch", KERAS_TORCH_DEVICE=device, KERAS_HOME=str(home))
        procs[name] = subprocess.Popen(
            [sys.executable, "-c", CHILD, cases],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    results = {}
    deadline = time.monotonic() + TIMEOUT  # for all of them together
    try:
        for name, p in procs.items():
            stdout, stderr = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            line = [ln for ln in stdout.splitlines() if ln.startswith("KERAS_RESULT ")]
            results[name] = (
                json.loads(line[-1][len("KERAS_RESULT ") :])
                if line
                else {"failed": f"exit {p.returncode}:\n{stdout[-3000:]}\n{stderr[-5000:]}"}
            )
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def _case(runs, child, name):
    res = runs[child]
    assert "failed" not in res, f"the {child} child failed ({res.get('failed')})"
    assert name not in res["errors"], f"{name} on {child}:\n{res['errors'][name]}"
    assert res["backend"] == "torch"
    return res[name]


def _close(got, want, rtol, atol):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=rtol, atol=atol)


# float32, the same initial weights and data. Measured between tpu and CPU: losses equal or 1e-7 apart
# (relative), BatchNorm statistics 2e-7, predictions 3e-6 relative (7e-8 absolute: XLA and CPU torch sum
# in other orders); 1e-4 leaves room for another plugin's or CPU's kernels without hiding a wrong op.
RTOL, ATOL = 1e-4, 1e-6


def test_functional_model_fits_like_cpu(runs):
    tpu, cpu = _case(runs, "tpu", "mlp"), _case(runs, "cpu", "mlp")
    assert tpu["devices"] == ["tpu:0"] and cpu["devices"] == ["cpu"]
    assert len(tpu["loss"]) == 3 and tpu["loss"][-1] < tpu["loss"][0]
    _close(tpu["loss"], cpu["loss"], RTOL, ATOL)


def test_predict_and_evaluate_like_cpu(runs):
    tpu, cpu = _case(runs, "tpu", "mlp"), _case(runs, "cpu", "mlp")
    assert np.asarray(tpu["predict"]).shape == (8, 2)
    _close(tpu["predict"], cpu["predict"], RTOL, 1e-5)
    _close(tpu["evaluate"], cpu["evaluate"], RTOL, ATOL)


def test_cnn_fits_like_cpu(runs):
    tpu, cpu = _case(runs, "tpu", "cnn"), _case(runs, "cpu", "cnn")
    assert tpu["devices"] == ["tpu:0"]
    assert len(tpu["loss"]) == 2 and tpu["loss"][1] < tpu["loss"][0]
    _close(tpu["loss"], cpu["loss"], RTOL, ATOL)
    _close(tpu["accuracy"], cpu["accuracy"], 0, 1e-6)
    # BatchNormalization's moving statistics, updated in each training step
    _close(tpu["moving_mean"], cpu["moving_mean"], RTOL, ATOL)
    _close(tpu["moving_variance"], cpu["moving_variance"], RTOL, ATOL)


def test_jit_compile_uses_the_tpu_backend_and_fits_like_cpu(runs):
    tpu, cpu = _case(runs, "tpu_jit", "jit"), _case(runs, "cpu", "tiny")
    assert tpu["calls"]["tpu"] > 0 and tpu["calls"]["inductor"] == 0, tpu["calls"]
    assert tpu["graph_replays"] > 0  # the compiled steps ran as torchtpu programs
    assert tpu["devices"] == ["tpu:0"]
    # the reference is the same model without jit_compile on CPU (Inductor's code would be another one)
    _close(tpu["loss"], cpu["loss"], RTOL, ATOL)


def test_seeded_initializers_and_random_ops_are_reproducible(runs):
    res = _case(runs, "tpu", "seeded")
    assert res["devices"] == ["tpu:0"]
    assert res["same"], "set_random_seed(7) twice built different weights"
    assert res["other_differs"], "set_random_seed(8) built the weights of set_random_seed(7)"
    # the draws are the distributions asked for, not only reproducible
    assert res["kernel_in_limit"] and 0.8 < res["kernel_std_ratio"] < 1.2, res
    assert res["dropout_same"] and 0.45 < res["dropout_kept"] < 0.55, res
    mean, std = res["normal_mean_std"]
    assert res["normal_same"] and abs(mean) < 0.15 and 0.9 < std < 1.1, res


@pytest.mark.parametrize("child", ["tpu", "tpu_jit"])
def test_every_op_ran_on_the_device(runs, child):
    res = runs[child]
    assert "failed" not in res, f"the {child} child failed ({res.get('failed')})"
    m = res["metrics"]
    # no op fell back to the CPU or lacked a kernel, and the steps ran as XLA programs
    assert m["fallback_ops"] == 0 and m["ops_not_registered"] == 0, m
    assert m["fused_programs_run"] > 0, m


def test_image_transforms_like_cpu(runs):
    # keras.ops.image.affine_transform, under RandomRotation, RandomZoom and RandomTranslation
    tpu, cpu = _case(runs, "tpu", "image"), _case(runs, "cpu", "image")
    for mode in ("bilinear", "nearest"):
        # (Keras's torch.tile of a 5-dim tensor: aten::repeat copies into a 10-dim view of its result)
        assert not isinstance(tpu[mode], str), f"affine_transform({mode}) on tpu: {tpu[mode]}"
        _close(tpu[mode], cpu[mode], RTOL, 1e-5)
    for layer in ("RandomRotation", "RandomZoom", "RandomTranslation"):
        assert tpu[layer] == ["tpu:0", [2, 8, 8, 3]], f"{layer} on tpu: {tpu[layer]}"
