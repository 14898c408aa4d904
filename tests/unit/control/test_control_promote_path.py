"""The way a version takes through a promote (issue 31): resolved once at the entry, then passed down.

A real promote of v2 over a serving v1 runs under a profiler that records every call of kappa's own
functions whose arguments carry v2 (its number, or an object of that version). The spec is looked up
by name once, the version's paths derived and its registry record read only where the design says
(the entry, readiness's `reread`, the pointer's publish), and no call goes up a layer. The counts are
printed: `pytest -s` shows them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from control_helpers import PIPELINE, ready_version
from orchestrator.lifecycle.promote import promote

ROOT = Path(__file__).resolve().parents[3] / "orchestrator"
RANK = {"core": 0, "registry": 1, "context": 2, "jobctl": 3, "observe": 3, "serving": 3, "lifecycle": 4}
NAMES = {"version", "n", "new_version", "target", "to_version", "v", "serving", "other", "current"}
ROWS_V1 = [("m1", "swe", "SWE", "Ada", 1), ("m2", "pm", "PM", "Grace", 3)]
ROWS_V2 = [("m1", "swe", "Software Engineer", "Ada", 1), ("m2", "pm", "PM", "Grace", 3)]


def _carries(frame, n: int) -> bool:
    code = frame.f_code
    if code.co_varnames[:1] == ("self",) and _of_version(frame.f_locals.get("self"), n):
        return False    # a method of the version's own object (its handle, record, paths): asked, not passed down
    if code.co_argcount + code.co_kwonlyargcount <= 1 and code.co_varnames[:1] in (("self",), ("cls",)):
        return False                      # a property or an accessor, not a stop on the version's way
    for name in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]:
        value = frame.f_locals.get(name)
        if name in NAMES and isinstance(value, int) and not isinstance(value, bool) and value == n:
            return True
        if _of_version(value, n):
            return True
    return False


def _of_version(value, n: int) -> bool:
    return getattr(value, "version", None) == n and getattr(value, "pipeline", None) == PIPELINE


def _trace(k, n: int):
    stops, names, stack = [], [], []

    def profile(frame, event, _arg):
        if event == "call":
            ours = frame.f_code.co_filename.startswith(str(ROOT))
            if ours and frame.f_code.co_name == "pipeline" and frame.f_locals.get("name") == PIPELINE:
                names.append(frame.f_globals["__name__"])        # Kappa.pipeline(name): a look-up by name
            if ours and _carries(frame, n):
                caller = next((s for s in reversed(stack) if s is not None), None)
                stop = (frame.f_globals["__name__"], frame.f_code.co_name)
                stops.append((*stop, caller))
                stack.append(stop)
            else:
                stack.append(None)
        elif event == "return" and stack:
            stack.pop()

    sys.setprofile(profile)
    try:
        promote(k.version(PIPELINE, n), actor="bob", reason="new rules")
    finally:
        sys.setprofile(None)
    return stops, names


def test_a_promote_resolves_the_version_once_and_never_climbs_a_layer(k, fake_log):
    v1 = ready_version(k, fake_log, ROWS_V1)
    promote(k.version(PIPELINE, v1), actor="alice", reason="first")
    v2 = ready_version(k, fake_log, ROWS_V2)
    stops, lookups = _trace(k, v2)

    def layer(module: str) -> str:
        return module.split(".")[1]

    calls = [f"{m}.{f}" for m, f, _ in stops]
    climbs = [(c[0], m) for m, _f, c in stops if c is not None and RANK[layer(m)] > RANK[layer(c[0])]]
    modules, returns, last = set(), 0, None
    for m, _f, _c in stops:
        returns += m != last and m in modules
        modules.add(m)
        last = m
    print("promote path:", json.dumps({"stops": len(stops), "modules": len(modules), "returns": returns,
                                       "climbs": len(climbs), "spec_lookups": len(lookups),
                                       "paths_derived": calls.count("orchestrator.core.paths.version_paths"),
                                       "record_reads": calls.count("orchestrator.registry.store.get_version")}))
    assert calls[:2] == ["orchestrator.context.kappa.version", "orchestrator.context.kappa.resolve"]
    assert lookups == ["orchestrator.context.kappa"], lookups                 # once, by the builder
    assert climbs == [], climbs
    # about half the 14 modules the way crossed when issue 31 was filed (this tracer on c70dadd^: 77 stops in
    # 14 modules, 53 returns to a module already left); the way now: the handle's builder, the paths, the
    # registry, promote, readiness, lag, the job's health and the report
    assert len(modules) <= 8, sorted(modules)
    # the entry's resolve, and the publish of the pointer (from the alias record); nothing between
    assert calls.count("orchestrator.core.paths.version_paths") == 2, calls
    # the entry's resolve, and readiness deciding on the registry as it is now (`v.reread()`)
    assert calls.count("orchestrator.registry.store.get_version") == 2, calls
    assert "orchestrator.lifecycle.promote.promote" in calls and "orchestrator.lifecycle.promote.flip" in calls
