"""Benchmark of shipping a real-size model: archive, save, load, memory and latency, before/after.

    python bench/bench_ship.py --work DIR [--before CHECKOUT] [--layers 8] [--repeat 5]
                               [--rounds 3] [--keep]

A Llama-shaped LlamaForCausalLM (``--layers 19``: 1.04 GiB; float32, built from a config with
random weights, nothing downloaded) serves generate() traffic (batches 1-3, left padding, with
and without a mask: 4 call groups) under a Recorder. Then, for each code tree (``--before``: a
checkout of the code to compare with, e.g. ``git archive main``; and this checkout), in fresh
processes:

1. export + `ExportResult.save` (probes off: the export itself is not what is measured):
   save time, archive size, bytes of the archive's tensor records (``--keep``: kept in
   ``--work`` and reused by the next run, so a rerun measures loads only);
2. cold starts, ``--rounds`` of each kind alternated, each in a fresh process that has
   imported torch, transformers and replay: ``AutoModelForCausalLM.from_pretrained`` of the
   model's safetensors, or `replay.load` of the artifact, then the first call generate()
   makes (prefill of the first prompt, recorded once by a forward pre-hook); the medians and
   their ratios (load, first answer), and CPython's full garbage collections in each phase
   (each walks every object of the process);
3. `replay.load` in a new process: load time, RSS after load split into anonymous memory and
   file-backed pages (a memory-mapped archive is file-backed), the bytes of every live tensor
   storage (each distinct storage once), then per program the first call and the median of
   ``--repeat`` calls on an original generate() call (a forward pre-hook copy), each timed
   next to an eager call of the same inputs (the machine is shared: pairs see the same load);
   RSS again after serving (the eager model deleted): a mapped archive's pages are read as
   the programs touch them, as file-backed memory.

Every number is also a ratio to the model's own weights or to eager latency. Prints Markdown on
stdout (progress on stderr); the results go to docs/benchmarks.md. Needs ~4x the model in free
memory for the "before" load (it held one copy per program).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import code_line, load_line, machine_line, md_table  # noqa: E402

# (batch, prompt length): batch 1 drops the all-ones mask, batches 2-3 are left-padded.
WORKLOAD = ((1, 5), (2, 7), (1, 9), (2, 4), (3, 6))

RECORD = """
import json, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
import safetensors.torch as st
import capture
from fixtures.models import run_generate
work, layers = sys.argv[1], int(sys.argv[2])
config = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
    num_hidden_layers=layers, num_attention_heads=16, num_key_value_heads=4,
    max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    tie_word_embeddings=False)
torch.manual_seed(0)
model = LlamaForCausalLM(config).eval()
config.save_pretrained(work + "/model")
st.save_model(model, work + "/model/model.safetensors")
with capture.Recorder(model, work + "/store", flush_seconds=3600):
    run_generate(model, json.loads(sys.argv[3]), max_new_tokens=4)
weights = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
           for t in [*model.parameters(), *model.buffers()]}
print(json.dumps({"weight_bytes": sum(weights.values()),
                  "params": sum(p.numel() for p in model.parameters())}))
"""

EXPORT = """
import json, sys, time, zipfile, torch, transformers
import safetensors.torch as st
import replay, capture
work, label = sys.argv[1], sys.argv[2]
config = transformers.AutoConfig.from_pretrained(work + "/model")
model = transformers.LlamaForCausalLM(config).eval()
st.load_model(model, work + "/model/model.safetensors")
t = time.perf_counter()
result = replay.export(model, work + "/store", probes=0)
export_s = time.perf_counter() - t
path = f"{work}/{label}.pt2"
t = time.perf_counter()
result.save(path)
save_s = time.perf_counter() - t
with zipfile.ZipFile(path) as z:
    records = sum(i.file_size for i in z.infolist()
                  if i.filename.split("/")[-1].startswith(("weight_", "tensor_")))
print(json.dumps({"export_s": export_s, "save_s": save_s, "programs": sorted(result.programs),
                  "complete": result.complete, "archive_bytes": __import__("os").path.getsize(path),
                  "record_bytes": records, "capture": capture.__file__}))
"""

SERVE = """
import copy, gc, json, os, statistics, sys, time
def rss():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(line.split()[1]) * 1024
    return out
import torch, transformers, replay
import safetensors.torch as st
work, label, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
gc.collect()
before = rss()
t = time.perf_counter()
runner = replay.load(f"{work}/{label}.pt2")
load_s = time.perf_counter() - t
gc.collect()
after = rss()
seen = {}
for obj in gc.get_objects():
    if type(obj) in (torch.Tensor, torch.nn.Parameter) and obj.device.type != "meta":
        s = obj.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
storage_bytes = sum(seen.values())
config = transformers.AutoConfig.from_pretrained(work + "/model")
model = transformers.LlamaForCausalLM(config).eval()
st.load_model(model, work + "/model/model.safetensors")
calls = {}
def hook(m, args, kwargs):
    group = runner.select(*args, **kwargs)
    calls.setdefault(group, (copy.deepcopy(args), copy.deepcopy(kwargs)))
handle = model.register_forward_pre_hook(hook, with_kwargs=True)
from fixtures.models import run_generate
run_generate(model, json.loads(sys.argv[4]), max_new_tokens=4)
handle.remove()
def timed(fn, args, kwargs):
    a, k = copy.deepcopy(args), copy.deepcopy(kwargs)
    t = time.perf_counter(); fn(*a, **k); return time.perf_counter() - t
latency = {}
with torch.no_grad():
    for group, (args, kwargs) in sorted(calls.items()):
        first = timed(runner, args, kwargs)
        pairs = [(timed(runner, args, kwargs), timed(model, args, kwargs)) for _ in range(repeat)]
        latency[group] = {"first": first, "steady": statistics.median(p[0] for p in pairs),
                          "eager": statistics.median(p[1] for p in pairs)}
del model
gc.collect()
print(json.dumps({"load_s": load_s, "rss_before": before, "rss_after": after, "rss_served": rss(),
                  "storage_bytes": storage_bytes, "latency": latency, "capture": replay.__file__}))
"""


FIRST_CALL = """
import json, sys, torch, transformers
import safetensors.torch as st
from fixtures.models import run_generate
work = sys.argv[1]
config = transformers.AutoConfig.from_pretrained(work + "/model")
model = transformers.LlamaForCausalLM(config).eval()
st.load_model(model, work + "/model/model.safetensors")
tensors, recipe, seen = {}, {}, []
def hook(m, args, kwargs):  # read at call time: generate() grows the cache in place after it
    if seen:
        return
    seen.append(list(kwargs))  # the order matters: it is part of the call's structure
    for name, value in kwargs.items():
        if isinstance(value, torch.Tensor):
            tensors[name] = value.detach().clone().contiguous()
        elif isinstance(value, transformers.DynamicCache):
            assert value.get_seq_length() == 0, "the first call of generate() has an empty cache"
            recipe[name] = {"empty_cache": True}
        else:
            recipe[name] = {"value": value}
model.register_forward_pre_hook(hook, with_kwargs=True)
run_generate(model, json.loads(sys.argv[2])[:1], max_new_tokens=1)
st.save_file(tensors, work + "/first_call.safetensors")
with open(work + "/first_call.json", "w") as f:
    json.dump({"order": seen[0], "values": recipe}, f)
print(json.dumps({"names": seen[0]}))
"""

COLD = """
import json, sys, time, torch, transformers, replay
import safetensors.torch as st
work, kind, path = sys.argv[1], sys.argv[2], sys.argv[3]
config = transformers.AutoConfig.from_pretrained(work + "/model")
def first_call():
    tensors = st.load_file(work + "/first_call.safetensors")
    with open(work + "/first_call.json") as f:
        saved = json.load(f)
    kwargs = {}
    for name in saved["order"]:
        how = saved["values"].get(name)
        if how is None:
            kwargs[name] = tensors[name]
        elif "empty_cache" in how:
            kwargs[name] = transformers.DynamicCache(config=config)
        else:
            kwargs[name] = how["value"]
    return kwargs
kwargs = first_call()
import gc
full = []  # seconds of each full collection (CPython's, of every object of the process)
def collected(phase, info, start=[0.0]):
    if info["generation"] == 2:
        if phase == "start":
            start[0] = time.perf_counter()
        else:
            full.append(time.perf_counter() - start[0])
gc.callbacks.append(collected)
with torch.no_grad():
    t = time.perf_counter()
    if kind == "eager":
        model = transformers.AutoModelForCausalLM.from_pretrained(work + "/model").eval()
    else:
        model = replay.load(path)
    loaded = time.perf_counter()
    in_load = list(full)
    out = model(**kwargs)
    answered = time.perf_counter()
print(json.dumps({"load_s": loaded - t, "first_s": answered - loaded,
                  "gc_load": in_load, "gc_first": full[len(in_load):],
                  "logits": out.logits.flatten()[:8].tolist()}))
"""


def _cold(work: Path, tree: Path, artifact: Path, rounds: int) -> dict[str, list[dict[str, Any]]]:
    """`from_pretrained` and `replay.load`, each then the first call of generate(), in fresh
    processes, alternated (`rounds` of each): the machine is shared, so neighbours see the
    same load."""
    out: dict[str, list[dict[str, Any]]] = {"eager": [], "replay": []}
    for _ in range(rounds):
        for kind in ("eager", "replay"):
            out[kind].append(_run(COLD, tree, str(work), kind, str(artifact)))
    return out


def _run(code: str, tree: Path, *args: str) -> dict[str, Any]:
    """Runs `code` in a fresh Python whose `capture`/`replay` come from `tree`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(ROOT)])}
    done = subprocess.run(
        # -P: the working directory (this checkout, maybe) must not shadow `tree`'s packages
        [sys.executable, "-P", "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"a benchmark step failed in {tree}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _median(runs: list[dict[str, Any]], key: str) -> float:
    import statistics

    return float(statistics.median(r[key] for r in runs))


def _collections(runs: list[dict[str, Any]], key: str) -> str:
    """CPython's full garbage collections in one phase of the cold starts: how many per
    process (each run's count) and the median seconds of one."""
    import statistics

    seconds = [s for r in runs for s in r[key]]
    counts = "/".join(str(len(r[key])) for r in runs)
    return f"{counts} ({statistics.median(seconds) * 1e3:.0f} ms each)" if seconds else counts


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _ratio(n: float, base: float) -> str:
    return f"{n / base:.2f}x"


def main() -> int:
    """Runs the benchmark once per code tree and prints the Markdown tables."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", required=True, help="an empty folder with room for ~4 GB")
    parser.add_argument("--before", help="a checkout of the code to compare with")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3, help="cold starts of each kind")
    parser.add_argument(
        "--keep", action="store_true", help="keep each exported .pt2 in --work and reuse it"
    )
    options = parser.parse_args()
    work = Path(options.work)
    (work / "model").mkdir(parents=True, exist_ok=True)
    workload = json.dumps(WORKLOAD)
    recorded = work / "recorded.json"
    if recorded.exists() and (work / "store").exists():  # a previous run's model and store
        model = json.loads(recorded.read_text())
    else:
        sys.stderr.write("building the model and recording its generate() traffic...\n")
        model = _run(RECORD, ROOT, str(work), str(options.layers), workload)
        recorded.write_text(json.dumps(model))
    if not (work / "first_call.json").exists():
        _run(FIRST_CALL, ROOT, str(work), workload)
    trees = ([("before", Path(options.before))] if options.before else []) + [("after", ROOT)]
    results: dict[str, dict[str, Any]] = {}
    for label, tree in trees:
        artifact = work / f"{label}.pt2"
        exported_json = work / f"{label}.export.json"
        if options.keep and artifact.exists() and exported_json.exists():
            exported = json.loads(exported_json.read_text())
        else:
            sys.stderr.write(f"{label}: export and save ({tree})...\n")
            exported = _run(EXPORT, tree, str(work), label)
            exported_json.write_text(json.dumps(exported))
        sys.stderr.write(f"{label}: cold starts, alternated with from_pretrained...\n")
        cold = _cold(work, tree, artifact, options.rounds)
        sys.stderr.write(f"{label}: load and serve in a fresh process...\n")
        served = _run(SERVE, tree, str(work), label, str(options.repeat), workload)
        results[label] = {**exported, **served, "cold": cold}
        sys.stderr.write(f"{label}: measured {served['capture']}\n")
        if not options.keep:
            os.unlink(artifact)
    weights = float(model["weight_bytes"])
    print(f"### Shipping a {weights / 2**30:.2f} GiB Llama: load, memory, latency\n")
    print(f"{machine_line(('torch', 'transformers'))}; {code_line(('replay',))}; {load_line()}.")
    print(
        f"Model: {options.layers} layers, hidden 1024, {model['params'] / 1e6:.0f} M parameters "
        f"float32; programs: {', '.join(results['after']['programs'])}.\n"
    )
    rows = []
    for label, r in results.items():
        grown = r["rss_after"]["VmRSS"] - r["rss_before"]["VmRSS"]
        anon = r["rss_after"]["RssAnon"] - r["rss_before"]["RssAnon"]
        file = r["rss_after"]["RssFile"] - r["rss_before"]["RssFile"]
        served_anon = r["rss_served"]["RssAnon"] - r["rss_before"]["RssAnon"]
        served_file = r["rss_served"]["RssFile"] - r["rss_before"]["RssFile"]
        rows.append(
            [
                label,
                f"{_gib(r['archive_bytes'])} ({_ratio(r['archive_bytes'], weights)})",
                _ratio(r["record_bytes"], weights),
                f"{r['save_s']:.1f} s",
                f"{r['load_s']:.1f} s",
                f"{_gib(grown)} ({_ratio(grown, weights)}): anon {_gib(anon)}, file {_gib(file)}",
                f"anon {_gib(served_anon)}, file {_gib(served_file)}",
                _ratio(r["storage_bytes"], weights),
            ]
        )
    headers = ["code", "archive", "tensor records", "save", "load", "RSS growth on load",
               "RSS growth after serving", "live tensor storages"]  # fmt: skip
    print(md_table(headers, rows) + "\n")
    lat_rows = []
    for label, r in results.items():
        for group, t in r["latency"].items():
            lat_rows.append(
                [
                    label,
                    group,
                    f"{t['first'] * 1e3:.0f} ms ({_ratio(t['first'], t['eager'])})",
                    f"{t['steady'] * 1e3:.1f} ms ({_ratio(t['steady'], t['eager'])})",
                    f"{t['eager'] * 1e3:.1f} ms",
                ]
            )
    print(md_table(["code", "program", "first call", "steady (median)", "eager"], lat_rows))
    print()
    cold_rows = []
    for label, r in results.items():
        eager, ours = r["cold"]["eager"], r["cold"]["replay"]
        load_e, load_r = _median(eager, "load_s"), _median(ours, "load_s")
        first_e, first_r = _median(eager, "first_s"), _median(ours, "first_s")
        total_e, total_r = load_e + first_e, load_r + first_r
        cold_rows.append(
            [
                label,
                f"{load_r:.2f} s / {load_e:.2f} s = **{load_r / load_e:.2f}**",
                f"{first_r * 1e3:.0f} ms / {first_e * 1e3:.0f} ms = **{first_r / first_e:.2f}**",
                f"{total_r:.2f} s / {total_e:.2f} s = {total_r / total_e:.2f}",
                f"{_collections(ours, 'gc_load')} / {_collections(eager, 'gc_load')}",
                f"{_collections(ours, 'gc_first')} / {_collections(eager, 'gc_first')}",
            ]
        )
    print(
        f"Cold start, fresh processes, {options.rounds} of each alternated (medians): "
        "`replay.load` vs `AutoModelForCausalLM.from_pretrained` of the same weights "
        "(safetensors), then the first call generate() makes (prefill, batch 1).\n"
    )
    headers = ["code", "load: replay / eager", "first answer: replay / eager", "load + first",
               "full collections in load: replay / eager", "in first answer"]  # fmt: skip
    print(md_table(headers, cold_rows))
    print(f"\nRatios: to the model's own weights ({_gib(weights)}) or to eager latency; "
          f"{time.strftime('%Y-%m-%d')}.")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
