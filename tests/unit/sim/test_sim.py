"""The simulator (`ebbflow_sim`): exact outcomes of small scenarios, determinism, CSV, flags."""

from __future__ import annotations

import gc
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from ebbflow_devtools.builders import make_demand
from ebbflow_operator.decision.allocator import Allocation
from ebbflow_operator.policies.throughput import Placement
from ebbflow_sim import cli
from ebbflow_sim.allocation import Placer, metrics, pinned_growth
from ebbflow_sim.cluster import ClusterConfig, GpuType, initial_nodes, node_type, replacement
from ebbflow_sim.job_state import JobState
from ebbflow_sim.simulation import SimConfig, Simulation
from ebbflow_sim.trace import SimJob, TraceConfig, generate, read_csv, write_csv


def job(name: str = "a", arrival: float = 0.0, lo: int = 1, hi: int = 4, seconds: float = 1000.0) -> SimJob:
    """A job that takes `seconds` on `hi` workers on one node."""
    base = SimJob(
        name=name,
        arrival_s=arrival,
        min_workers=lo,
        max_workers=hi,
        gpus_per_worker=1,
        work_samples=1.0,
        global_batch=32 * hi,
        virtual_nodes=hi,
        priority=0,
        alpha_c=0.005,
        beta_c=0.001,
        alpha_local=0.005,
        beta_local=0.0005,
        alpha_net=0.02,
        beta_net=0.001,
        gamma=2.0,
        loss_b=100.0,
    )
    return replace(base, work_samples=seconds * rate(base, hi, 1))


def rate(j: SimJob, workers: int, nodes: int) -> float:
    return j.model().goodput(Placement(workers, nodes))


def config(gpus: int = 8, per_node: int = 8, spot: float = 0.0, **kw: float) -> SimConfig:
    cluster = ClusterConfig(
        gpus=gpus,
        gpus_per_node=per_node,
        spot_fraction=spot,
        preempt_rate_per_hour=0.0,
        replace_delay_s=400.0,
    )
    return SimConfig(cluster=cluster, **kw)  # type: ignore[arg-type]


def sim(jobs: list[SimJob], policy: str, cfg: SimConfig) -> Simulation:
    s = Simulation(jobs, policy, cfg)
    s.run()
    return s


@pytest.mark.parametrize("policy", ["static", "restart", "fair", "goodput", "quality"])
def test_a_lone_job_finishes_at_work_over_throughput(policy: str) -> None:
    a = job(hi=4, seconds=1000.0)
    s = sim([a], policy, config())
    state = s.states["a"]
    workers = s.states["a"].shapes and max(k[0] for k in state.shapes)
    expected = a.work_samples / rate(a, workers, 1)
    assert state.finished_s == pytest.approx(expected, rel=1e-9)
    assert state.rescales == 0
    if policy != "goodput":  # goodput may stop where another GPU no longer pays
        assert workers == 4


@pytest.mark.parametrize(
    ("policy", "b_starts_at"),
    [
        pytest.param("static", 1000.0, id="static-waits-for-its-gang"),
        pytest.param("restart", 10.0, id="restart-starts-with-what-fits"),
    ],
)
def test_static_waits_for_its_gang(policy: str, b_starts_at: float) -> None:
    a = job("a", hi=6, seconds=1000.0)
    b = job("b", arrival=10.0, lo=2, hi=4, seconds=100.0)
    s = sim([a, b], policy, config())
    assert s.states["b"].started_s == pytest.approx(b_starts_at)
    assert s.states["a"].finished_s == pytest.approx(1000.0)


def test_restart_loses_work_to_the_checkpoint_elastic_only_the_pause() -> None:
    """8 workers over two 4-GPU nodes; the spot one is preempted at 1500 s and replaced at 1900 s."""
    a = job(hi=8, seconds=3000.0)
    cfg = config(gpus=8, per_node=4, spot=0.5, checkpoint_s=1000.0, rescale_pause_s=5.0, restart_s=60.0)
    r8, r4 = rate(a, 8, 2), rate(a, 4, 1)
    a = replace(a, work_samples=3000.0 * r8)
    runs = {}
    for policy in ("restart", "fair"):
        s = Simulation([a], policy, cfg)
        s.preempt_at(1500.0, "node-00000")
        s.run()
        runs[policy] = s.states["a"]
    assert runs["restart"].lost_samples == pytest.approx(500.0 * r8)
    assert runs["restart"].preemptions == 1
    elastic = runs["fair"]
    assert elastic.lost_samples == 0.0
    assert elastic.rescales == 2  # shrink at the preemption, grow when the node is back
    left = a.work_samples - r8 * 1500.0 - r4 * (1900.0 - 1505.0)
    assert elastic.finished_s == pytest.approx(1905.0 + left / r8)
    assert runs["restart"].finished_s is not None
    assert runs["restart"].finished_s > elastic.finished_s


def used_from_scratch(s: Simulation) -> dict[str, int]:
    used = dict.fromkeys(s.nodes, 0)
    for other in s.arrived.values():
        for node in other.workers:
            used[node] += other.job.gpus_per_worker
    return used


def rate_from_scratch(s: Simulation, state: JobState) -> float:
    """A job's rate worked out from every arrived job's workers, as the engine's `_rate` defines it."""
    if not state.workers:
        return 0.0
    used = used_from_scratch(s)
    distinct = set(state.workers)
    share = max(max(1.0, used[n] / s.devices.physical) for n in distinct)
    speed = min(node_type(s.config.cluster, n).speed for n in distinct)
    model = state.job.model(state.noise_step)
    return model.goodput(Placement(len(state.workers), len(distinct), share, speed), state.batch)


@pytest.mark.parametrize(
    ("policy", "adaptive"), [("fair", 0.0), ("goodput", 0.0), ("goodput", 0.5), ("restart", 0.5)]
)
def test_every_rate_is_current_after_every_change(policy: str, adaptive: float) -> None:
    """The engine keeps node usage incrementally and re-rates only the jobs whose workers, nodes'
    usage or batch changed; after every change the usage and each arrived job's rate must equal ones
    worked out from scratch. Time-sliced nodes (a neighbour slows a job down), two GPU types,
    frequent spot preemptions and batch changes exercise every way it changes."""

    class Checked(Simulation):
        checks = 0

        def _changed(self) -> None:
            super()._changed()
            assert self.used == used_from_scratch(self)
            for state in self.arrived.values():
                assert state.rate == rate_from_scratch(self, state), state.job.name
                self.checks += 1

    types = (GpuType("fast", 0.5, 1.0), GpuType("slow", 0.5, 0.5))
    cluster = ClusterConfig(gpus=32, gpus_per_node=4, replicas=2, preempt_rate_per_hour=2.0, gpu_types=types)
    trace = TraceConfig(
        jobs=30,
        gpus=32,
        load=3.0,
        median_duration_s=600.0,
        elastic_max_factor=2 if adaptive else 1,
        adaptive_batch_fraction=adaptive,
        max_batch_factor=8,
    )
    s = Checked(generate(trace, seed=5), policy, SimConfig(cluster=cluster, seed=5))
    s.run()
    assert s.checks > 100
    assert s.preemptions > 0
    changed = [st for st in s.states.values() if st.batch != st.job.global_batch]
    assert bool(changed) is (policy == "goodput" and adaptive > 0)
    grew = [st for st in s.states.values() if st.noise_scale > st.job.noise_scale]
    assert bool(grew) is (adaptive > 0 and policy != "restart")  # the rigid baselines' B is fixed


@pytest.mark.parametrize("policy", ["static", "restart", "fair", "goodput", "quality"])
def test_a_simulation_leaves_no_reference_cycles(policy: str) -> None:
    """`Simulation.run` turns the cyclic garbage collector off: whatever it drops must be freed by
    reference counting alone (a cycle would stay in memory until the run ends)."""
    cluster = ClusterConfig(
        gpus=64,
        replicas=2,
        spot_fraction=0.5,
        preempt_rate_per_hour=2.0,
        gpu_types=(GpuType("A100", 0.5, 1.0), GpuType("T4", 0.5, 0.3)),
    )
    trace = TraceConfig(jobs=12, gpus=32, elastic_max_factor=4, adaptive_batch_fraction=0.5)
    s = Simulation(generate(trace, 2), policy, SimConfig(cluster=cluster, seed=2))
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # keep what the collector finds, to name it on failure
    try:
        s.run()
        assert gc.isenabled() and gc.collect() == 0, sorted({type(o).__qualname__ for o in gc.garbage})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert s.preemptions > 0


def test_same_seed_same_json(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--jobs", "12", "--gpus", "32", "--seed", "3", "--spot-preempt-rate", "0.5", "--json"]
    cli.main(args)
    first = capsys.readouterr().out
    cli.main(args)
    assert capsys.readouterr().out == first
    assert len(first.splitlines()) == 5


def test_trace_csv_round_trip(tmp_path: Path) -> None:
    jobs = generate(TraceConfig(jobs=25, gpus=64), seed=7)
    assert read_csv(write_csv(jobs)) == jobs
    path = tmp_path / "t.csv"
    path.write_text(write_csv(jobs))
    [result] = cli.run(["--trace", str(path), "--gpus", "64", "--policy", "fair"])
    assert len(result.jct_s) == 25


def test_generator_is_heavy_tailed_and_seeded() -> None:
    jobs = generate(TraceConfig(jobs=400, gpus=512), seed=1)
    assert generate(TraceConfig(jobs=400, gpus=512), seed=1) == jobs
    small = sum(j.max_workers <= 8 for j in jobs) / len(jobs)
    assert 0.75 < small < 0.95
    assert max(j.max_workers for j in jobs) >= 32
    arrivals = [j.arrival_s for j in jobs]
    assert arrivals == sorted(arrivals)


def test_room_to_grow_keeps_the_request_for_the_rigid_baselines() -> None:
    """--elastic-max-factor 4: an elastic job may grow to 4x what it asked for, with the same batch
    split into 4x the virtual nodes; static and restart still run the request, V = request."""
    asked = generate(TraceConfig(jobs=60, gpus=512), seed=3)
    roomy = generate(TraceConfig(jobs=60, gpus=512, elastic_max_factor=4), seed=3)
    for before, job in zip(asked, roomy, strict=True):
        requested = before.max_workers
        assert job.requested_workers == requested and job.min_workers == before.min_workers
        assert job.max_workers == job.virtual_nodes == min(4 * requested, 512)
        assert job.global_batch == before.global_batch == 32 * requested
        rigid = job.rigid()
        assert (rigid.max_workers, rigid.virtual_nodes) == (requested, requested)
        assert rigid.work_samples == pytest.approx(before.work_samples)  # the same duration when rigid
    with pytest.raises(ValueError, match="elastic_max_factor 3"):
        TraceConfig(elastic_max_factor=3)


def test_a_trace_without_requested_workers_runs_rigidly_at_max(tmp_path: Path) -> None:
    jobs = generate(TraceConfig(jobs=5, gpus=64), seed=2)
    header, *rows = write_csv(jobs).splitlines()
    column = header.split(",").index("requested_workers")

    def drop(line: str) -> str:
        return ",".join(v for i, v in enumerate(line.split(",")) if i != column)

    old = read_csv("\n".join(drop(line) for line in [header, *rows]) + "\n")
    assert [j.rigid().max_workers for j in old] == [j.max_workers for j in jobs]


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        pytest.param(
            ["--elastic-max-factor", "3"], "--elastic-max-factor", id="max-factor-not-a-power-of-two"
        ),
        pytest.param(["--jobs", "0"], "--jobs", id="jobs-zero"),
        pytest.param(["--jobs", "x"], "--jobs", id="jobs-not-a-number"),
        pytest.param(["--spot-fraction", "1.5"], "--spot-fraction", id="spot-fraction"),
        pytest.param(["--spot-preempt-rate", "-1"], "--spot-preempt-rate", id="preempt-rate"),
        pytest.param(["--policy", "nope"], "--policy", id="policy"),
        pytest.param(["--gpus", "10", "--gpus-per-node", "8"], "--gpus", id="gpus-not-whole-nodes"),
        pytest.param(["--trace", "/nonexistent.csv"], "--trace", id="trace-missing"),
        pytest.param(["--gpu-types", "A100:half:1"], "--gpu-types", id="gpu-type-share-not-a-number"),
        pytest.param(["--gpu-types", "A100:0.5:0"], "--gpu-types", id="gpu-type-speed-zero"),
        pytest.param(["--gpu-types", ":0.5:1"], "--gpu-types", id="gpu-type-without-name"),
        pytest.param(
            ["--adaptive-batch-fraction", "1.5"], "--adaptive-batch-fraction", id="adaptive-fraction"
        ),
        pytest.param(["--max-batch-factor", "-1"], "--max-batch-factor", id="max-batch-factor"),
        pytest.param(["--noise-scale-range", "0:4"], "--noise-scale-range", id="noise-range-zero"),
        pytest.param(["--noise-scale-range", "8:4"], "--noise-scale-range", id="noise-range-reversed"),
        pytest.param(["--noise-scale-range", "x"], "--noise-scale-range", id="noise-range-not-numbers"),
        pytest.param(["--noise-growth", "-1"], "--noise-growth", id="noise-growth-negative"),
        pytest.param(["--noise-growth", "5"], "--noise-growth", id="noise-growth-too-steep"),
    ],
)
def test_bad_flags_fail_naming_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    assert flag in capsys.readouterr().err


def test_plot_writes_the_series_and_the_figures(tmp_path: Path) -> None:
    cli.run(
        ["--jobs", "5", "--gpus", "16", "--policy", "fair", "--policy", "static", "--plot", str(tmp_path)]
    )
    for policy in ("fair", "static"):
        jcts = (tmp_path / f"jct_{policy}.csv").read_text().splitlines()
        assert jcts[0] == "jct_s" and len(jcts) == 1 + 5, policy
        assert (tmp_path / f"utilization_{policy}.csv").read_text().startswith("time_s,utilization")
    for figure in ("jct_cdf.png", "utilization.png"):  # matplotlib is a dev dependency
        assert (tmp_path / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", figure


def test_plot_writes_the_series_without_matplotlib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)  # import raises ImportError
    cli.run(["--jobs", "5", "--gpus", "16", "--policy", "fair", "--plot", str(tmp_path)])
    assert (tmp_path / "jct_fair.csv").read_text().startswith("jct_s")
    assert not (tmp_path / "jct_cdf.png").exists()


def test_gpu_types_take_their_share_of_nodes_spot_and_on_demand_alike() -> None:
    types = (GpuType("A100", 0.75, 1.0), GpuType("T4", 0.25, 0.3))
    cluster = ClusterConfig(gpus=800, gpus_per_node=8, spot_fraction=0.5, gpu_types=types)
    nodes = initial_nodes(cluster)
    t4 = {n for n in nodes if node_type(cluster, n).name == "T4"}
    assert abs(len(t4) - 25) <= 1
    assert abs(sum(1 for n in t4 if nodes[n]) - 12.5) <= 2, "T4 nodes spread over spot and on-demand"
    assert all(node_type(cluster, replacement(replacement(n))) == node_type(cluster, n) for n in nodes)


def test_a_job_on_a_slower_gpu_type_runs_at_that_speed_and_reports_it() -> None:
    a = job(hi=4, seconds=1000.0)
    cfg = config()
    slow = replace(cfg, cluster=replace(cfg.cluster, gpu_types=(GpuType("T4", 1.0, 0.25),)))
    state = sim([a], "fair", slow).states["a"]
    assert state.finished_s == pytest.approx(a.work_samples / a.model().goodput(Placement(4, 1, 1.0, 0.25)))
    assert state.finished_s > 1000.0
    (measured,) = state.shapes.values()
    assert measured.gpu_type == "T4"
    assert measured.compute_s == pytest.approx(4 * a.params.compute_s(measured.micro_batch))


def test_a_job_across_gpu_types_runs_at_the_slowest_and_reports_no_single_type() -> None:
    """Eight workers over two 4-GPU nodes, one A100 and one four times slower."""
    types = (GpuType("A100", 0.5, 1.0), GpuType("T4", 0.5, 0.25))
    cfg = config(gpus=8, per_node=4)
    cfg = replace(cfg, cluster=replace(cfg.cluster, gpu_types=types))
    assert {node_type(cfg.cluster, n).name for n in initial_nodes(cfg.cluster)} == {"A100", "T4"}
    a = job(hi=8, seconds=1000.0)
    state = sim([a], "fair", cfg).states["a"]
    assert state.finished_s == pytest.approx(a.work_samples / a.model().goodput(Placement(8, 2, 1.0, 0.25)))
    assert [m.gpu_type for m in state.shapes.values()] == [""]


def test_the_policies_see_the_learned_speed_of_each_measurement() -> None:
    state = JobState(job(hi=4))
    state.measure(Placement(4, 1, 1.0, 0.25), 1.0, "T4")
    state.measure(Placement(4, 1, 1.0, 1.0), 1.0, "A100")
    seen = metrics(state, 5.0, {"A100": 1.0, "T4": 0.25}).measurements
    assert sorted((m.gpu_type, m.speed) for m in seen) == [("A100", 1.0), ("T4", 0.25)]
    slow, fast = sorted(seen, key=lambda m: m.speed)
    assert slow.compute_s == pytest.approx(4 * fast.compute_s)


# --- batch-size co-adaptation -----------------------------------------------------------------------


def test_batch_options_change_nothing_else_in_the_trace() -> None:
    """The noise scales and max batches come from their own random stream: with the options the
    trace is the same but for `max_batch`; each max is a multiple of V above B0 (B0 x the factor)."""
    plain = generate(TraceConfig(jobs=80, gpus=512, elastic_max_factor=4), seed=3)
    half = generate(TraceConfig(jobs=80, gpus=512, elastic_max_factor=4, adaptive_batch_fraction=0.5), seed=3)
    assert [replace(j, max_batch=0) for j in half] == plain
    adaptive = [j for j in half if j.max_batch]
    assert 20 < len(adaptive) < 60
    for job in adaptive:
        assert job.max_batch == 4 * job.global_batch and job.max_batch % job.virtual_nodes == 0
        assert job.rigid().max_batch == 0 and job.rigid().model().max_batch is None
    for job in plain:
        assert 0.25 <= job.noise_scale / job.global_batch <= 16.0
    every = generate(TraceConfig(jobs=80, gpus=512, adaptive_batch_fraction=1.0, max_batch_factor=8), seed=3)
    assert all(j.max_batch == 8 * j.global_batch for j in every)
    assert read_csv(write_csv(every)) == every
    with pytest.raises(ValueError, match="noise_ratio"):
        TraceConfig(noise_ratio=(2.0, 1.0))
    with pytest.raises(ValueError, match="noise_growth"):
        TraceConfig(noise_growth=-1.0)


def test_a_trace_without_batch_columns_keeps_b_fixed() -> None:
    jobs = generate(TraceConfig(jobs=5, gpus=64, adaptive_batch_fraction=1.0, max_batch_factor=4), seed=2)
    header, *rows = write_csv(jobs).splitlines()
    keep = [
        i for i, c in enumerate(header.split(",")) if c not in ("noise_scale", "max_batch", "noise_growth")
    ]
    old = read_csv("\n".join(",".join(line.split(",")[i] for i in keep) for line in [header, *rows]) + "\n")
    assert [(j.max_batch, j.noise_scale, j.noise_growth) for j in old] == [(0, 0.0, 0.0)] * 5
    bad = write_csv([replace(jobs[0], max_batch=jobs[0].global_batch - 1)])
    with pytest.raises(ValueError, match="max_batch"):
        read_csv(bad)


def adaptive_job(noise: float, max_factor: int = 8) -> SimJob:
    """`job()` on 4 workers, sync-bound across nodes, allowed to grow B to `max_factor` x B0."""
    base = replace(job(hi=4, seconds=4000.0), alpha_net=0.2, beta_net=0.02)
    return replace(base, noise_scale=noise, max_batch=base.global_batch * max_factor)


@pytest.mark.parametrize(
    ("noise", "larger"),
    [pytest.param(1e6, True, id="phi huge: larger B, sooner"), pytest.param(1.0, False, id="phi tiny: B0")],
)
def test_goodput_runs_an_adaptive_job_at_the_batch_it_chose(noise: float, larger: bool) -> None:
    """A lone job on one node: the policy picks B from its fitted model; the job progresses at the
    true model's goodput at that B (samples at B0's efficiency), and a change of B costs no pause."""
    adaptive = adaptive_job(noise)
    fixed = replace(adaptive, max_batch=0)
    runs = {j.max_batch: sim([j], "goodput", config()) for j in (adaptive, fixed)}
    [ran] = runs[adaptive.max_batch].states.values()
    [plain] = runs[0].states.values()
    assert (ran.batch > adaptive.global_batch) is larger
    assert ran.batch <= adaptive.max_batch and ran.batch % adaptive.virtual_nodes == 0
    assert ran.rescales == plain.rescales == 0
    assert plain.batch == fixed.global_batch
    assert plain.finished_s is not None and ran.finished_s is not None
    assert (ran.finished_s < plain.finished_s) is larger
    if not larger:
        assert ran.finished_s == plain.finished_s


def test_only_goodput_changes_the_batch_and_the_rigid_baselines_run_b0() -> None:
    jobs = [adaptive_job(1e6)]
    for policy in ("static", "restart", "fair", "quality"):
        [state] = sim(jobs, policy, config()).states.values()
        assert state.batch == jobs[0].global_batch, policy


def test_the_policy_sees_the_noise_scale_and_max_only_of_adaptive_jobs() -> None:
    adaptive = JobState(adaptive_job(300.0))
    fixed = JobState(replace(adaptive_job(300.0), max_batch=0))
    seen = metrics(adaptive, 5.0, {})
    assert (seen.noise_scale, seen.max_batch, seen.global_batch) == (300.0, 8 * 128, 128)
    assert (metrics(fixed, 5.0, {}).noise_scale, metrics(fixed, 5.0, {}).max_batch) == (None, None)


@pytest.mark.parametrize(
    ("growth", "at_100_steps", "at_300"),
    [
        pytest.param(0.0, 300.0, 300.0, id="constant"),
        pytest.param(1.0, 600.0, 1200.0, id="as-one-over-the-loss"),
        pytest.param(2.0, 1200.0, 4800.0, id="squared"),
    ],
)
def test_the_noise_scale_grows_as_the_loss_falls(growth: float, at_100_steps: float, at_300: float) -> None:
    """phi(k) = phi(0) x (loss(0) / loss(k)) ** growth, with loss(k) = b / (k + b) and b = 100 steps
    here: the loss halves after 100 steps and quarters after 300."""
    j = replace(adaptive_job(300.0), noise_growth=growth)
    assert j.loss.loss(100.0) == 0.5 and j.loss.loss(300.0) == 0.25
    assert (j.noise_scale_at(0.0), j.noise_scale_at(100.0), j.noise_scale_at(300.0)) == pytest.approx(
        (300.0, at_100_steps, at_300)
    )
    assert j.model(300.0).noise_scale == pytest.approx(at_300)
    assert j.rigid().model(300.0).noise_scale is None  # B fixed: the noise scale plays no part


def test_a_job_takes_the_noise_scale_of_its_last_loss_report_at_a_pass() -> None:
    """Between passes the job trains with the phi it was rated with (so its rate stays exact); a pass
    moves it on to phi at the last loss milestone, and the policy sees that value."""
    state = JobState(replace(adaptive_job(300.0), noise_growth=1.0))
    state.set_workers(["node-00000"] * 4)
    state.rate = rate(state.job, 4, 1)
    state.report_loss()
    state.advance(50.0, checkpoint_s=1800.0)
    assert state.steps > 1000 and state.noise_scale == 300.0  # not taken yet
    last = state.losses[-1][0]
    assert last <= state.steps < last * 1.25 + 1
    assert state.take_noise_scale() is True
    assert state.noise_scale == pytest.approx(300.0 * (1 + last / state.job.loss_b))
    assert metrics(state, 5.0, {}).noise_scale == state.noise_scale
    assert state.take_noise_scale() is False  # no new report since


@pytest.mark.parametrize(
    ("growth", "grows_b"),
    [
        pytest.param(0.0, False, id="phi constant: B0 throughout"),
        pytest.param(1.0, True, id="phi grows: larger B"),
    ],
)
def test_a_growing_noise_scale_lets_goodput_grow_the_batch_and_finish_sooner(
    growth: float, grows_b: bool
) -> None:
    """phi(0) = 10 makes B0 the best batch at first; as the loss falls phi grows, a larger batch
    becomes worth its lower efficiency, and the job finishes before the one whose phi stays at 10."""
    j = replace(adaptive_job(10.0), noise_growth=growth)
    [state] = sim([j], "goodput", config()).states.values()
    assert state.finished_s is not None
    assert (state.batch > j.global_batch) is grows_b
    assert (state.finished_s < 4000.0 - 1.0) is grows_b
    assert state.rescales == 0


def test_placer_moves_workers_onto_the_policys_node() -> None:
    """Job a's workers off n1 land on n1 (the policy's node), and b grows into the room they leave."""
    free = {"n0": 4, "n1": 4}
    a = make_demand("a", 1, 4, created=2.0, nodes=free, current=("n1", "n1", "n0", "n0"))
    b = make_demand("b", 1, 4, created=1.0, nodes=free, current=("n0", "n0"))
    placed = Placer(free, {}).apply([a, b], {a.key: 4, b.key: 4}, {a.key: ("n1", "n1")})
    assert placed == {a.key: ["n1"] * 4, b.key: ["n0"] * 4}


def test_placer_puts_growth_where_the_policy_placed_it() -> None:
    """The operator pins a growth to the policy's nodes (`Allocation.growth`): the scheduler's
    spread would have put the second worker on n1."""
    free = {"n0": 4, "n1": 4}
    a = make_demand("a", 1, 4, nodes=free, current=("n0",))
    assert Placer(free, {}).apply([a], {a.key: 3}, growth={a.key: ("n0", "n0")}) == {a.key: ["n0"] * 3}
    assert Placer(free, {}).apply([a], {a.key: 3}, growth={a.key: ("n0",)}) == {a.key: ["n0", "n1", "n0"]}


def test_growth_is_pinned_only_into_gpus_no_running_worker_holds() -> None:
    """As the operator pins (`decide`): the policy may place a growth on GPUs it takes from another
    job's running worker, which the operator cannot pin into until that worker is gone."""
    free = {"n0": 4, "n1": 4}
    a = make_demand("a", 1, 4, created=1.0, nodes=free, current=("n0", "n0"))
    b = make_demand("b", 1, 4, created=2.0, nodes=free, current=("n1", "n1", "n1"))
    decision = Allocation({a.key: 4, b.key: 2}, growth={a.key: ("n0", "n0"), b.key: ("n0", "n1")})
    assert pinned_growth(decision, [a, b], free) == {a.key: ("n0", "n0")}
    moved_in = Allocation({a.key: 3, b.key: 2}, growth={a.key: ("n1",)})
    assert pinned_growth(moved_in, [a, b], free) == {a.key: ("n1",)}


def test_placer_without_moves_keeps_running_workers_where_they_are() -> None:
    free = {"n0": 4, "n1": 4}
    a = make_demand("a", 1, 4, nodes=free, current=("n1", "n1", "n0", "n0"))
    assert Placer(free, {}).apply([a], {a.key: 4}) == {a.key: ["n1", "n1", "n0", "n0"]}


@pytest.mark.parametrize(
    ("free", "gpus", "count", "current", "expected"),
    [
        pytest.param({"n0": 4, "n1": 4}, 1, 2, (), ["n0", "n1"], id="a-new-job-spreads"),
        pytest.param({"n0": 2, "n1": 2}, 1, 3, (), ["n0", "n1", "n0"], id="then-its-own-nodes"),
        pytest.param({"n0": 1, "n1": 4}, 1, 1, (), ["n1"], id="least-allocated-first"),
        pytest.param({"n0": 1, "n1": 2}, 2, 1, (), ["n1"], id="only-where-the-worker-fits"),
        pytest.param({"n0": 4, "n1": 3}, 1, 3, ("n0",), ["n0", "n1", "n0"], id="growth-spreads-out"),
    ],
)
def test_placer_places_new_workers_as_the_scheduler_spreads_them(
    free: dict[str, int], gpus: int, count: int, current: tuple[str, ...], expected: list[str]
) -> None:
    """The operator names no node for a new worker: the default scheduler's topology spread puts it
    where the job has fewest pods, then on the least allocated node (the policy's packing would
    have put a new two-worker job on one node)."""
    a = make_demand("a", 1, 4, gpus=gpus, nodes=free, current=current)
    assert Placer(free, {}).apply([a], {a.key: count}) == {a.key: expected}


@pytest.mark.parametrize(
    ("before", "after", "rescales", "pause"),
    [
        pytest.param(["n0", "n1"], ["n0", "n0"], 1, 5.0, id="some-stay-one-round"),
        pytest.param(["n1", "n2"], ["n0", "n0"], 0, 60.0, id="none-stays-a-restart"),
        pytest.param(["n0", "n1"], ["n0"], 1, 5.0, id="a-shrink-one"),
        pytest.param(["n0"], ["n0", "n1"], 1, 5.0, id="a-growth-one"),
    ],
)
def test_a_move_costs_what_the_operator_makes_the_trainers_pay(
    before: list[str], after: list[str], rescales: int, pause: float
) -> None:
    """The operator deletes a moving job's leaving workers before its new ones run: the stayers
    re-form and the newcomers join that round; with no stayer the job hands over and restarts."""
    a = job(hi=2, seconds=1000.0)
    s = Simulation([a], "fair", config(gpus=12, per_node=4, rescale_pause_s=5.0, restart_s=60.0))
    state = s.states["a"]
    state.started_s = 0.0
    state.set_workers(before)
    s.now = 100.0
    assert s._move(state, after)
    assert (state.rescales, state.paused_until - s.now) == (rescales, pause)
    assert state.workers == after


def test_a_job_shrunk_to_nothing_pays_the_restart_when_it_runs_again() -> None:
    """A hand-over costs nothing lost, but the new pods still start and load it: the restart cost."""
    a = job(hi=2, seconds=1000.0)
    s = Simulation([a], "fair", config(gpus=8, per_node=4, restart_s=60.0))
    state = s.states["a"]
    state.started_s = 0.0
    state.set_workers(["n0"])
    s.now = 50.0
    s._move(state, [])
    s._move(state, ["n1"])
    assert state.paused_until == 110.0
    assert state.lost_samples == 0.0


@pytest.mark.parametrize("syncs", [1, 7, 250], ids=["one-catch-up", "a-few", "every-few-seconds"])
def test_progress_and_loss_reports_do_not_depend_on_how_often_a_job_catches_up(syncs: int) -> None:
    """The engine brings a job's progress up to date lazily (`JobState.advance` from `synced_s`), so
    how often it does must not show: the same progress and checkpoint (to rounding) and the same
    loss reports, each at a milestone step (1.25x the last, at least one step on), as the trainers
    would report them."""
    state = JobState(job(seconds=5000.0))
    state.set_workers(["node-00000"] * 4)
    state.rate = rate(state.job, 4, 1)
    state.paused_until = 100.0  # a pause at the start counts no progress
    state.report_loss()
    for i in range(1, syncs + 1):
        state.advance(3000.0 * i / syncs, checkpoint_s=1800.0)
    expected_samples = state.rate * 2900.0
    assert state.progress == pytest.approx(expected_samples, rel=1e-12)
    assert state.checkpoint == pytest.approx(state.rate * 1800.0, rel=1e-12)
    milestones = [0.0]
    while (step := max(milestones[-1] * 1.25, milestones[-1] + 1.0)) <= state.steps:
        milestones.append(step)
    assert [step for step, _ in state.losses] == milestones
    assert [loss for _, loss in state.losses] == [state.job.loss.loss(step) for step in milestones]
    assert state.finish_time() == pytest.approx(
        3000.0 + (state.job.work_samples - state.progress) / state.rate
    )
