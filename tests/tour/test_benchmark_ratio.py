"""The tour's benchmark says when a ratio means nothing (issue 30, item 8): timed runs interleaved
across backends; a ratio of medians only when the spreads allow one, on a machine that is not busy."""

from __future__ import annotations

from debug_module.demo.result_steps import _interleaved, ratio_text


def _lat(median: float, lo: float, hi: float) -> dict:
    return {"median": median, "iqr": [lo, hi]}


def test_a_ratio_only_where_the_spreads_allow_one():
    eager = _lat(0.40, 0.39, 0.42)
    assert ratio_text(eager, _lat(0.20, 0.19, 0.21)) == ("2.00x", True)
    text, ok = ratio_text(eager, _lat(0.41, 0.40, 0.43))
    assert not ok and "overlap" in text
    text, ok = ratio_text(_lat(70.0, 56.0, 84.0), _lat(6.0, 1.0, 9.0))  # the busy machine of the issue
    assert not ok and "spread" in text
    text, ok = ratio_text(eager, _lat(0.20, 0.19, 0.21), busy="the machine is busy (load average 9.0 on 2 CPU(s))")
    assert not ok and "busy" in text


def test_timed_runs_are_interleaved():
    calls: list[str] = []
    samples = _interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b"),
                            "c": lambda: calls.append("c")}, 3)
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert {k: len(v) for k, v in samples.items()} == {"a": 3, "b": 3, "c": 3}


def test_scheduler_nodes_after_fusion_count_each_fused_node_once():
    from debug_module.demo.compile_steps import scheduler_nodes

    pre = "op0: SchedulerNode(\n  x\nop1: SchedulerNode(\nop2: SchedulerNode(\nop3: ExternKernelSchedulerNode(\n"
    post = ("op0: SchedulerNode(\nop1_op2: OuterLoopFusedSchedulerNode(\nop1: SchedulerNode(\n"
            "op2: SchedulerNode(\nop3: ExternKernelSchedulerNode(\n")
    assert scheduler_nodes(pre) == 4 and scheduler_nodes(post) == 3


def test_the_summary_never_cuts_a_word_or_a_number():
    """Issue 30 item 8: the summary's result column cut headlines at 110 characters ("1 benchmark f")."""
    from debug_module.demo.runner import SUMMARY_CELL_CHARS, summary_cell

    report = ("5 run(s), 5 ATen graph(s), 88 violation(s), 0 graph break(s), KernelDiff 1/1 passed, 1 repro(s), "
              "1 benchmark file(s)")
    assert len(report) > 110 and summary_cell(report) == report  # the table wraps it whole
    long = " ".join(f"word{i} 1.25e-05" for i in range(60))
    short = summary_cell(long)
    kept = short.removesuffix(" ... (see the step's output)")
    assert short.endswith("(see the step's output)") and len(kept) <= SUMMARY_CELL_CHARS
    assert long.startswith(kept) and long[len(kept)] == " " and kept.split()[-1] in long.split()
