"""The text of torchtpu.metrics_report() (and of TORCHTPU_METRICS=1 at exit):
metrics() grouped by what they tell a user, with units. Counters of the
core's own bookkeeping (live_records, unwind_tables_ignored) stay in
metrics() only; the flush causes that never happened are left out."""

# (group, [(metric, what it counts, unit)]); unit: "" a count, "s" seconds, "B" bytes
GROUPS = [
    (
        "ops",
        [
            ("ops_dispatched", "ops dispatched to tpu", ""),
            ("fallback_ops", "ops run on the CPU (TORCHTPU_CPU_FALLBACK=1)", ""),
            ("ops_not_registered", "lowered ATen overloads this torch lacks", ""),
        ],
    ),
    (
        "programs",
        [
            ("programs_compiled", "programs compiled by XLA", ""),
            ("compile_seconds", "compiling", "s"),
            ("cache_hits", "calls whose program was in memory", ""),
            ("cache_misses", "calls whose program was not (compiled, or loaded from disk)", ""),
            ("cache_entries", "programs held in memory", ""),
            ("cache_evictions", "programs dropped from memory (TORCHTPU_PROGRAM_CACHE_SIZE)", ""),
        ],
    ),
    (
        "disk cache",
        [
            ("disk_cache_hits", "programs loaded from disk", ""),
            ("disk_cache_misses", "programs not on disk", ""),
            ("disk_cache_writes", "programs written to disk", ""),
            ("disk_load_seconds", "loading them", "s"),
            ("disk_cache_corrupt", "entries refused as damaged", ""),
            ("disk_cache_refused", "entries refused as not ours (key or signature)", ""),
        ],
    ),
    (
        "TPU compile-only target (TORCHTPU_AOT_TOPOLOGY)",
        [
            ("aot_programs_compiled", "programs compiled for the TPU topology", ""),
            ("aot_programs_failed", "programs its compiler refused", ""),
            ("aot_programs_too_big", "of them, larger than a chip's memory", ""),
            ("aot_disk_cache_hits", "found compiled in the disk cache", ""),
            ("aot_compile_seconds", "compiling for the TPU", "s"),
        ],
    ),
    (
        "execution",
        [
            ("execute_seconds", "waiting for programs to finish", "s"),
            ("fused_programs_run", "fused programs run", ""),
            ("fused_ops", "ops recorded into them", ""),
            ("fused_ops_pruned", "recorded ops dropped as unused", ""),
            ("backward_passes", "backward passes launched", ""),
            ("graph_replays", "graph replays (torch.compile, torch.tpu.graph)", ""),
            ("spmd_programs_run", "programs run over a device mesh", ""),
            ("spmd_layouts_chosen", "values laid out as XLA's partitioner chose", ""),
            ("spmd_layout_fallbacks", "mesh programs recompiled with the shape rule's layouts", ""),
            ("replica_collectives", "replica-mode collectives", ""),
        ],
    ),
    (
        "memory and transfers",
        [
            ("live_buffers", "device buffers alive now", ""),
            ("h2d_bytes", "host to device", "B"),
            ("d2h_bytes", "device to host", "B"),
            ("d2d_bytes", "device to device", "B"),
            ("host_memory_views", "buffers read or written in place by the host", ""),
        ],
    ),
    (
        "torch.profiler",
        [
            ("profiler_records", "torchtpu events recorded for profiles", ""),
        ],
    ),
    (
        "torch.distributed",
        [
            ("collectives", "collectives called on the tpu backend", ""),
            ("collective_seconds", "in them (wall time)", "s"),
        ],
    ),
]
INTERNAL = {"live_records", "unwind_tables_ignored"}


def _value(v, unit):
    if unit == "s":
        return f"{v:.3f} s"
    if unit == "B":
        for size, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if v >= size:
                return f"{v / size:.1f} {name} ({v} B)"
        return f"{v} B"
    return str(v)


def report(m):
    """m: torchtpu.metrics(). The grouped text; a metric no group names (one
    added to the core later) is listed under "other" rather than lost."""
    shown = set(INTERNAL)
    rows = []
    for group, items in GROUPS:
        rows.append((group, None))
        for key, what, unit in items:
            if key in m:
                rows.append((f"{what} ({key})", _value(m[key], unit)))
                shown.add(key)
    flushes = {k: v for k, v in m.items() if k.startswith("flushes_")}
    shown.update(flushes)
    rows.append(("fused programs launched, by what launched them", None))
    for k, v in flushes.items():
        if v:
            rows.append((f"{k[len('flushes_') :].replace('_', ' ')} ({k})", str(v)))
    other = [k for k in m if k not in shown]
    if other:
        rows.append(("other", None))
        rows.extend((f"({k})", _value(m[k], "s" if k.endswith("_seconds") else "")) for k in other)
    width = max(len(label) for label, v in rows if v is not None)
    lines = ["torchtpu metrics"]
    for label, v in rows:
        lines.append(f"  {label}" if v is None else f"    {label:<{width}}  {v}")
    return "\n".join(lines)
