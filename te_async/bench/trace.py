"""Bubble meter: GPU busy and idle time from a ``jax.profiler`` perfetto trace.

The bubble of a step is the GPU-idle time between its first kernel's start and
its last kernel's end. Only CUDA stream lines carry
real device activity; the derived lines XLA adds to a device ("XLA Ops",
"XLA Modules", "Steps", ...) span gaps or repeat kernels, so counting them would
hide the very bubbles we want to see. All times are in microseconds, in the
trace's own time base.
"""
import gzip
import json
import math
import os
import pathlib
import re
import statistics

_GPU = re.compile(r"/device:GPU:(\d+)(?!\d)")
_CUPTI_API = re.compile(r"^cu(da)?[A-Z]")
_SYNC = ("cuStreamSynchronize", "cudaStreamSynchronize", "cuEventSynchronize",
         "cudaEventSynchronize", "cuCtxSynchronize")
_GRAPH_LAUNCH = re.compile(r"^cu(da)?GraphLaunch")
_COMMAND_BUFFER = re.compile(r"command_?buffer", re.I)
_DIRECTIONS = {"d2h": re.compile(r"D2H|DtoH|DeviceToHost|device_to_host", re.I),
               "h2d": re.compile(r"H2D|HtoD|HostToDevice|host_to_device", re.I),
               "d2d": re.compile(r"D2D|DtoD|DeviceToDevice|device_to_device", re.I),
               "p2p": re.compile(r"P2P|PtoP|peer", re.I)}


def find_trace(log_dir):
    """The newest trace under ``log_dir``; jax writes it to a timestamped run folder."""
    found = []
    for root, _, files in os.walk(log_dir):
        for f in files:
            if f.endswith(".trace.json.gz") or f == "perfetto_trace.json.gz":
                p = os.path.join(root, f)
                # Both files of one run hold the same events; prefer perfetto's on a tie.
                found.append((os.path.getmtime(p), f == "perfetto_trace.json.gz", p))
    if not found:
        raise FileNotFoundError(f"no *.trace.json.gz or perfetto_trace.json.gz under {log_dir}")
    return max(found)[2]


def load_events(path):
    """Events of a trace file, or of the newest trace under a log directory."""
    if os.path.isdir(path):
        path = find_trace(path)
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data.get("traceEvents", []) if isinstance(data, dict) else data


def _names(events):
    procs, threads = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            procs[e.get("pid")] = e.get("args", {}).get("name", "")
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e.get("pid"), e.get("tid"))] = e.get("args", {}).get("name", "")
    return procs, threads


def _complete(events):
    return [e for e in events if e.get("ph") == "X" and "ts" in e and "dur" in e]


def _kind(e, stream):
    """Classify a stream event; the direction may sit in its name, its args or its stream's name."""
    text = e.get("name", "") + " " + json.dumps(e.get("args", {}))
    if "memcpy" in text.lower():
        for d, rx in _DIRECTIONS.items():
            if rx.search(text) or rx.search(stream):
                return "memcpy_" + d
        return "memcpy_other"
    return "memset" if "memset" in e.get("name", "").lower() else "kernel"


def device_events(events, device=0):
    """Kernels, memcpys and memsets on ``device``'s CUDA stream lines, sorted by start.

    Each is a dict with stream, start, end, name, kind and args.
    """
    procs, threads = _names(events)
    pids = {p for p, n in procs.items() if (m := _GPU.search(n)) and int(m.group(1)) == device}
    out = []
    for e in _complete(events):
        stream = threads.get((e.get("pid"), e.get("tid")), "")
        if e.get("pid") in pids and "Stream" in stream:
            ts = float(e["ts"])
            out.append(dict(stream=stream, start=ts, end=ts + float(e["dur"]), name=e.get("name", ""),
                            kind=_kind(e, stream), args=e.get("args", {})))
    return sorted(out, key=lambda d: d["start"])


def host_events(events):
    """Complete events outside GPU device processes: Python, XLA runtime and CUPTI API lines."""
    procs, _ = _names(events)
    return [e for e in _complete(events) if not _GPU.search(procs.get(e.get("pid"), ""))]


def union(intervals):
    """Sorted, merged (start, end) pairs, so overlapping streams count once."""
    merged = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [tuple(m) for m in merged]


def steps(events, annotation=None, device=0):
    """Step windows: host ``(start, end)`` and the device events each step owns.

    A step owns the device events that start between its annotation's start and
    the next annotation's start (the last step: its annotation's end), because
    dispatch is asynchronous and a step's kernels may run after its host span.
    Without a matching annotation the whole trace is one step.
    """
    dev = device_events(events, device)
    marks = []
    if annotation is not None:
        marks = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in host_events(events)
                       if e.get("name") == annotation or e.get("name", "").startswith(annotation + "#"))
    if not marks:
        return [dict(host=(-math.inf, math.inf), events=dev)]
    bounds = [s for s, _ in marks[1:]] + [marks[-1][1]]
    return [dict(host=(s, b), events=[d for d in dev if s <= d["start"] < b])
            for (s, _), b in zip(marks, bounds)]


def _cupti_visible(hosts):
    """Whether CUPTI API callbacks reached the host lines at all; without them a count of 0 means nothing."""
    return any(_CUPTI_API.match(e.get("name", "")) for e in hosts)


def _in(hosts, host_window):
    lo, hi = host_window
    return [e.get("name", "") for e in hosts if lo <= float(e["ts"]) < hi]


def _host_syncs(hosts, host_window):
    if not _cupti_visible(hosts):
        return None
    return sum(any(s in n for s in _SYNC) for n in _in(hosts, host_window))


def _graph_launches(hosts, host_window, dev):
    """Graph launches: host cu(da)GraphLaunch calls or, as CUPTI tags graph kernels
    (cuda_graph_id) with their launch's correlation_id, distinct launches seen on the device.
    """
    host = sum(bool(_GRAPH_LAUNCH.match(n)) for n in _in(hosts, host_window))
    tagged = [d for d in dev if any("graph_id" in k for k in d["args"]) or _COMMAND_BUFFER.search(d["name"])]
    launches = {(next((v for k, v in d["args"].items() if "graph_id" in k), None),
                 d["args"].get("correlation_id")) for d in tagged}
    if host or launches:
        return max(host, len(launches))
    return 0 if _cupti_visible(hosts) else None


def _span(dev):
    return (dev[0]["start"], max(d["end"] for d in dev)) if dev else (0.0, 0.0)


def window_stats(dev, window=None, gap_threshold_us=1.0):
    """Busy, idle and gaps of device events inside ``window`` (default: first start to last end)."""
    lo, hi = window or _span(dev)
    busy = union((max(d["start"], lo), min(d["end"], hi)) for d in dev if d["end"] > lo and d["start"] < hi)
    edges = [lo] + [x for iv in busy for x in iv] + [hi]
    gaps = [(a, b - a) for a, b in zip(edges[::2], edges[1::2]) if b - a > gap_threshold_us]
    inside = [d for d in dev if d["end"] > lo and d["start"] < hi]
    busy_us = float(sum(e - s for s, e in busy))
    counts = {k: sum(d["kind"] == k for d in inside)
              for k in ("kernel", "memset", "memcpy_d2h", "memcpy_h2d", "memcpy_d2d", "memcpy_p2p", "memcpy_other")}
    return dict(start_us=lo, end_us=hi, window_us=hi - lo, busy_us=busy_us, idle_us=(hi - lo) - busy_us,
                idle_fraction=((hi - lo) - busy_us) / (hi - lo) if hi > lo else 0.0,
                n_kernels=counts["kernel"], n_memcpy_d2h=counts["memcpy_d2h"], counts=counts, gaps=gaps)


def analyze_trace(path, device=0, annotation=None, gap_threshold_us=1.0):
    """Per-step bubble figures and the median step's, from a trace file or log directory.

    The summary is one real step (the median by window length, lower middle when
    even), not per-field medians, so its busy + idle still add up to its window.
    A trace without GPU events gives a zero summary marked ``no_gpu_events``.
    """
    events = load_events(path)
    hosts = host_events(events)
    result = []
    for i, st in enumerate(steps(events, annotation, device)):
        s = window_stats(st["events"], gap_threshold_us=gap_threshold_us)
        s.update(step=i, host_window=st["host"], n_host_syncs=_host_syncs(hosts, st["host"]),
                 n_graph_launches=_graph_launches(hosts, st["host"], st["events"]))
        result.append(s)
    ran = [s for s in result if s["window_us"] > 0]
    keys = ("busy_us", "idle_us", "idle_fraction", "n_kernels", "n_memcpy_d2h", "n_host_syncs", "n_graph_launches")
    if ran:
        med = sorted(ran, key=lambda s: s["window_us"])[(len(ran) - 1) // 2]
        summary = {k: med[k] for k in keys} | dict(step=med["step"], window_us=med["window_us"], no_gpu_events=False)
    else:
        summary = {k: 0 for k in keys} | dict(idle_fraction=0.0, n_host_syncs=result[0]["n_host_syncs"],
                                              n_graph_launches=None, step=None, window_us=0.0,
                                              no_gpu_events=True, note=f"no GPU events for device {device}")
    return dict(path=path, device=device, annotation=annotation, steps=result, summary=summary)


def timeline_intervals(path, device=0, window=None):
    """[(stream, start_us, dur_us, name)] clipped to ``window``, for plot_timeline."""
    dev = device_events(load_events(path), device)
    lo, hi = window or _span(dev)
    return [(d["stream"], max(d["start"], lo), min(d["end"], hi) - max(d["start"], lo), d["name"])
            for d in dev if d["end"] > lo and d["start"] < hi]


_TE_ASYNC_KERNEL = re.compile(r"te_async::(?:\w+::)*\(anonymous namespace\)::(\w+)")


def kernel_name(name: str) -> str:
    """A device event's name, short: te_async's kernels by their function name, XLA's fusions
    without their numeric suffix, so that a layer's kernels add up across layers."""
    match = _TE_ASYNC_KERNEL.search(name)
    return match.group(1) if match else re.sub(r"[._]\d+$", "", name)[:60]


LONG_GAP_US = 5.0  # an idle gap longer than a launch's own latency: the GPU waited for the host


def launches(intervals):
    """(kernel, busy_us, idle_before_us) of each launch of one step's timeline_intervals, in time
    order: the idle time just before it, on every stream (a gap is charged to the kernel that
    ended it; a scan's trip boundaries land on its body's first kernel)."""
    covered = None
    for _, start, dur, name in sorted(intervals, key=lambda iv: iv[1]):
        yield kernel_name(name), dur, 0.0 if covered is None else max(0.0, start - covered)
        covered = start + dur if covered is None else max(covered, start + dur)


def kernel_table(intervals) -> list:
    """[(kernel, launches, busy_us, idle_before_us)] of one step's timeline_intervals, most time
    first, summed over the launches of each kernel."""
    rows = {}
    for kernel, dur, idle in launches(intervals):
        row = rows.setdefault(kernel, [0, 0.0, 0.0])
        row[0] += 1
        row[1] += dur
        row[2] += idle
    return sorted(((k, n, busy, idle) for k, (n, busy, idle) in rows.items()), key=lambda r: -(r[2] + r[3]))


def long_gaps_line(intervals, most: int = 5) -> str:
    """The gaps over LONG_GAP_US, counted and summed, and the `most` longest with the kernel each
    came before: many of them at a scan's trip boundaries mean the host fell behind the GPU."""
    gaps = sorted(((idle, k) for k, _, idle in launches(intervals) if idle > LONG_GAP_US), reverse=True)
    if not gaps:
        return f"no gap over {LONG_GAP_US:g} us"
    longest = ", ".join(f"{idle:.1f} before {k}" for idle, k in gaps[:most])
    count = f"{len(gaps)} gap{'s' if len(gaps) > 1 else ''}"
    return f"{count} over {LONG_GAP_US:g} us, {sum(g for g, _ in gaps):.1f} us in all; the longest: {longest}"


def trip_table(intervals, min_trips: int = 4) -> tuple:
    """(trips, [(kernel, start_us, end_us)]): the unit of launches that repeats most often back to
    back in one step's timeline_intervals (a scan's trip: a layer), and for each of its launches
    the median start and end over the trips, in µs from the trip's first start. Programmatic
    dependents start before the kernel they wait for ends, so the ends, not the durations, say where
    a chain's time goes. The unit covers the most launches in at least `min_trips` repeats (the
    shortest such unit), its first launch the one after the longest idle at its boundary; (0, [])
    when nothing repeats."""
    ivs = sorted(intervals, key=lambda iv: iv[1])
    names = [kernel_name(iv[3]) for iv in ivs]
    idle = [i for _, _, i in launches(ivs)]
    best, unit = (0, 0, 0.0), None  # (launches covered, -period, idle before the trips), (period, first, trips)
    for period in range(1, len(names) // min_trips + 1):
        # the longest stretch where every name equals the one a period later: (its length) // period + 1 trips
        longest, first, length = 0, 0, 0
        for i in range(len(names) - period):
            length = length + 1 if names[i] == names[i + period] else 0
            if length > longest:
                longest, first = length, i - length + 1
        trips = longest // period + 1
        if trips < min_trips:
            continue
        for start in range(first, first + longest - (trips - 1) * period + 1):  # the unit's phase
            key = (trips * period, -period, sum(idle[start + t * period] for t in range(trips)))
            if key > best:
                best, unit = key, (period, start, trips)
    if unit is None:
        return 0, []
    period, start, trips = unit
    firsts = [start + t * period for t in range(trips)]
    return trips, [(names[start + k], statistics.median(ivs[j + k][1] - ivs[j][1] for j in firsts),
                    statistics.median(ivs[j + k][1] + ivs[j + k][2] - ivs[j][1] for j in firsts))
                   for k in range(period)]


def kernel_markdown(intervals_by_mode, top: int = 25) -> str:
    """Per mode, the `top` rows of kernel_table, the long gaps' line and trip_table, as markdown."""
    parts = []
    for mode, intervals in intervals_by_mode.items():
        rows = kernel_table(intervals)
        busy = sum(r[2] for r in rows)
        lines = [f"**{mode}**: {sum(r[1] for r in rows)} launches, {busy:.1f} us of kernels, "
                 f"{sum(r[3] for r in rows):.1f} us idle between them; {long_gaps_line(intervals)}", "",
                 "| kernel | launches | GPU us | share | idle before us |", "|---|---|---|---|---|"]
        lines += [f"| {k} | {n} | {us:.1f} | {us / busy:.0%} | {idle:.1f} |" for k, n, us, idle in rows[:top]]
        trips, unit = trip_table(intervals)
        if unit:
            lines += ["", f"One trip ({trips} in a row, {len(unit)} launches each): median start and end, us "
                      "from the trip's first start", "", "| kernel | start us | end us |", "|---|---|---|"]
            lines += [f"| {k} | {start:.1f} | {end:.1f} |" for k, start, end in unit]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def write_timeline(intervals_by_mode, stem, plots: bool) -> None:
    """A benchmark's profiled step per mode, as `stem`.json, its GPU time per kernel as
    `stem`_kernels.md and, with plots, `stem`.png; nothing when no mode was profiled."""
    if not intervals_by_mode:
        return
    pathlib.Path(f"{stem}.json").write_text(json.dumps(intervals_by_mode))
    pathlib.Path(f"{stem}_kernels.md").write_text(kernel_markdown(intervals_by_mode))
    if plots:
        plot_timeline(intervals_by_mode, f"{stem}.png")


def plot_timeline(intervals_by_mode, out_png):
    """One row per mode, so bubbles of the modes line up as white space on a shared axis."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(intervals_by_mode)
    fig, ax = plt.subplots(figsize=(12, 0.6 * len(modes) + 1.2))
    for row, mode in enumerate(modes):
        ivs = intervals_by_mode[mode]
        t0 = min((s for _, s, _, _ in ivs), default=0.0)
        for copy, color in ((False, "tab:blue"), (True, "tab:orange")):
            bars = [(s - t0, d) for _, s, d, n in ivs if ("memcpy" in n.lower()) == copy]
            if bars:
                ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=color)
    ax.set_yticks(range(len(modes)), modes)
    ax.set_ylim(-0.6, len(modes) - 0.4)
    ax.invert_yaxis()
    ax.set_xlabel("time from window start (us); blue kernels, orange memcpy, white bubbles")
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return out_png
