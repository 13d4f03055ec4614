"""Device generators: torch.Generator(device="tpu") has its own state
(manual_seed, initial_seed, seed, get_state/set_state, clone_state), every
random op given one draws from it and moves it on, reproducibly, in every
eager mode and under torch.compile, without touching the default generator;
torch.tpu.default_generators are the default generator (torch.manual_seed's)
itself. Errors: another device's generator, a bad state, a capture."""

import pytest
import torch

import torchtpu

MODES = ("strict", "fused", "debug")


def _same(a, b):
    return torch.equal(a.cpu(), b.cpu())


# Every ATen row of torchtpu that takes generator= (a tpu tensor x of 64 floats in [0, 1) to fill or read).
DRAWS = {
    "rand": lambda x, g: torch.rand(64, device="tpu", generator=g),
    "randn": lambda x, g: torch.randn(8, 8, device="tpu", generator=g),
    "randint": lambda x, g: torch.randint(0, 1000, (64,), device="tpu", generator=g),
    "randperm": lambda x, g: torch.randperm(64, device="tpu", generator=g),
    "uniform_": lambda x, g: x.clone().uniform_(-2, 3, generator=g),
    "normal_": lambda x, g: x.clone().normal_(1.0, 2.0, generator=g),
    "normal.Tensor_Tensor": lambda x, g: torch.normal(x, x + 1, generator=g),
    "normal.Tensor_float": lambda x, g: torch.normal(x, 2.0, generator=g),
    "normal.float_Tensor": lambda x, g: torch.normal(1.0, x + 1, generator=g),
    "normal.float_float": lambda x, g: torch.normal(0.0, 1.0, (64,), device="tpu", generator=g),
    "bernoulli": lambda x, g: torch.bernoulli(x, generator=g),
    "bernoulli.p": lambda x, g: torch.ops.aten.bernoulli.p(x, 0.3, generator=g),
    "bernoulli_.float": lambda x, g: x.clone().bernoulli_(0.4, generator=g),
    "bernoulli_.Tensor": lambda x, g: x.clone().bernoulli_(x, generator=g),
    "exponential_": lambda x, g: x.clone().exponential_(2.0, generator=g),
    "geometric_": lambda x, g: x.clone().geometric_(0.3, generator=g),
    "cauchy_": lambda x, g: x.clone().cauchy_(generator=g),
    "log_normal_": lambda x, g: x.clone().log_normal_(0.0, 0.5, generator=g),
    "random_": lambda x, g: x.clone().random_(generator=g),
    "random_.to": lambda x, g: x.clone().random_(100, generator=g),
    "random_.from": lambda x, g: x.clone().random_(-50, 50, generator=g),
    "multinomial": lambda x, g: torch.multinomial(x + 0.1, 10, replacement=True, generator=g),
    "rrelu_with_noise": lambda x, g: torch.ops.aten.rrelu_with_noise(x - 0.5, torch.zeros_like(x), 0.1, 0.3, True, g),
}


@pytest.fixture
def x():
    return torch.rand(64, generator=torch.Generator().manual_seed(0)).to("tpu")


def test_a_tpu_generator_is_made_and_keeps_its_own_state():
    g = torch.Generator(device="tpu")
    assert g.device == torch.device("tpu", torch.tpu.current_device())
    assert torch.Generator(device="tpu:0").device == torch.device("tpu", 0)
    assert g.manual_seed(1234) is g and g.initial_seed() == 1234
    state = g.get_state()
    # torch.tpu.get_rng_state's layout: the seed, then the offset, little-endian uint64s
    assert state.dtype == torch.uint8 and state.shape == (16,) and state.device.type == "cpu"
    assert state[:8].view(torch.int64).item() == 1234 and state[8:].view(torch.int64).item() == 0
    torch.rand(10, device="tpu", generator=g)
    assert g.get_state()[8:].view(torch.int64).item() > 0  # the draw moved the offset on
    assert g.initial_seed() == 1234
    s = g.seed()  # a new random seed, offset 0
    assert g.initial_seed() == s and g.get_state()[8:].view(torch.int64).item() == 0
    # two new generators start from different random seeds, as torch's do
    assert torch.Generator(device="tpu").initial_seed() != torch.Generator(device="tpu").initial_seed()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", sorted(DRAWS))
def test_every_random_op_draws_from_the_generator_reproducibly(op, mode, x):
    draw = DRAWS[op]
    g = torch.Generator(device="tpu")
    with torchtpu.eager_mode(mode):
        torch.manual_seed(99)
        default_before = torch.tpu.get_rng_state()
        g.manual_seed(7)
        first = draw(x, g)
        second = draw(x, g)  # the generator moved on
        g.manual_seed(7)
        again = draw(x, g)
        # the default generator was neither read nor moved
        assert torch.equal(torch.tpu.get_rng_state(), default_before)
        from_default = draw(x, None)
        torch.manual_seed(99)
        assert _same(draw(x, None), from_default)
        other_seed = draw(x, torch.Generator(device="tpu").manual_seed(8))
    assert _same(first, again)
    assert first.dtype == from_default.dtype and first.shape == from_default.shape
    assert not _same(first, second)
    assert not _same(first, other_seed)


def test_the_same_seed_gives_the_same_numbers_in_every_mode(x):
    got = {}
    for mode in MODES:
        with torchtpu.eager_mode(mode):
            g = torch.Generator(device="tpu").manual_seed(21)
            got[mode] = [DRAWS[op](x, g).cpu() for op in ("rand", "normal_", "bernoulli", "randint")]
    for mode in MODES[1:]:
        assert all(torch.equal(a, b) for a, b in zip(got["strict"], got[mode])), mode


def test_set_state_and_clone_state_replay_the_stream():
    g = torch.Generator(device="tpu").manual_seed(3)
    torch.randn(5, device="tpu", generator=g)
    saved = g.get_state()
    a = torch.randn(5, device="tpu", generator=g)
    copy = g.clone_state()
    assert copy.device == g.device and torch.equal(copy.get_state(), g.get_state())
    b = torch.randn(5, device="tpu", generator=g)
    assert _same(torch.randn(5, device="tpu", generator=copy), b)  # the clone goes on from where it was made
    g.set_state(saved)
    assert _same(torch.randn(5, device="tpu", generator=g), a)
    # a state saved from the default generator replays on a generator of its own
    torch.manual_seed(5)
    st = torch.tpu.get_rng_state()
    want = torch.rand(7, device="tpu")
    assert _same(torch.rand(7, device="tpu", generator=torch.Generator(device="tpu").set_state(st)), want)


def test_seed_all_reseeds_the_default_generator_at_random():
    torch.manual_seed(1)
    torch.tpu.seed_all()
    first = torch.tpu.initial_seed()
    torch.tpu.random.seed_all()
    assert torch.tpu.initial_seed() != first and torch.tpu.get_rng_state()[8:].view(torch.int64).item() == 0


def test_generator_states_are_checked():
    g = torch.Generator(device="tpu").manual_seed(1)
    with pytest.raises(RuntimeError, match="16 bytes"):
        g.set_state(torch.zeros(8, dtype=torch.uint8))
    with pytest.raises(TypeError, match="ByteTensor"):
        g.set_state(torch.zeros(16, dtype=torch.int32))
    assert g.initial_seed() == 1 and g.get_state()[8:].view(torch.int64).item() == 0  # nothing was set


def test_default_generators_are_the_default_generator():
    gens = torch.tpu.default_generators
    assert isinstance(gens, tuple) and len(gens) == torch.tpu.device_count()
    assert all(isinstance(d, torch.Generator) and d.device == torch.device("tpu", i) for i, d in enumerate(gens))
    assert torch.tpu.default_generators[0] is gens[0]
    gens[0].manual_seed(77)
    assert torch.tpu.initial_seed() == 77
    assert torch.equal(gens[0].get_state(), torch.tpu.get_rng_state())
    a = torch.rand(4, device="tpu")
    torch.manual_seed(77)
    assert gens[0].initial_seed() == 77
    # given explicitly it is the default generator: the same draw, the same state after
    b = torch.rand(4, device="tpu", generator=gens[0])
    assert _same(a, b)
    gens[0].set_state(torch.tpu.get_rng_state())
    torch.manual_seed(77)
    assert torch.equal(gens[0].get_state()[8:], torch.zeros(8, dtype=torch.uint8))


def test_draws_from_a_generator_are_distributed_as_the_op_says():
    g = torch.Generator(device="tpu").manual_seed(4)
    p1 = torch.randperm(10, device="tpu", generator=g)
    g.manual_seed(4)
    assert _same(torch.randperm(10, device="tpu", generator=g), p1)
    assert sorted(p1.cpu().tolist()) == list(range(10))
    # draws from a generator are distributed as the op says
    g.manual_seed(0)
    u = torch.rand(20000, device="tpu", generator=g).cpu()
    assert 0.0 <= u.min() and u.max() < 1.0 and abs(u.mean().item() - 0.5) < 0.01
    n = torch.randn(20000, device="tpu", generator=g).cpu()
    assert abs(n.mean().item()) < 0.03 and abs(n.std().item() - 1.0) < 0.03


def test_another_devices_generator_is_refused():
    with pytest.raises(RuntimeError, match="Expected a 'tpu' device type for generator but found 'cpu'"):
        torch.rand(3, device="tpu", generator=torch.Generator())
    with pytest.raises(RuntimeError, match="Expected a 'tpu' device type for generator but found 'cpu'"):
        torch.ones(3, device="tpu").normal_(generator=torch.Generator().manual_seed(1))


def test_a_capture_refuses_a_generator_of_its_own_and_stays_usable():
    g = torch.Generator(device="tpu").manual_seed(1)
    graph = torch.tpu.TPUGraph()
    with pytest.raises(RuntimeError, match="cannot be captured by torch.tpu.graph"):
        with torch.tpu.graph(graph):
            torch.rand(3, device="tpu", generator=g)
    torch.manual_seed(2)
    a = torch.rand(3, device="tpu")
    torch.manual_seed(2)
    assert _same(torch.rand(3, device="tpu"), a)


def test_compiled_function_with_a_generator_draws_from_it():
    g = torch.Generator(device="tpu").manual_seed(5)

    def f(t):
        return t + torch.rand(t.shape, device=t.device, generator=g)

    t = torch.zeros(6, device="tpu")
    cf = torch.compile(f, backend="tpu")
    a, b = cf(t), cf(t)
    assert not _same(a, b)
    g.manual_seed(5)
    assert _same(f(t), a) and _same(f(t), b)


def test_a_seed_set_while_ops_are_recorded_is_for_later_ops():
    # fused mode: the draws recorded before torch.manual_seed keep the seed they were made with
    with torchtpu.eager_mode("fused"):
        torch.manual_seed(1)
        a = torch.rand(4, device="tpu")
        torch.manual_seed(7)
        b = torch.rand(4, device="tpu")
        a, b = a.cpu(), b.cpu()
    with torchtpu.eager_mode("strict"):
        torch.manual_seed(1)
        want_a = torch.rand(4, device="tpu").cpu()
        torch.manual_seed(7)
        want_b = torch.rand(4, device="tpu").cpu()
    assert torch.equal(a, want_a) and torch.equal(b, want_b) and not torch.equal(a, b)
