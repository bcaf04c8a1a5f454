#!/usr/bin/env bash
# varbench's checks that need a GPU, as one prepared run (not part of `make test`; CI has no GPU).
#
#   OUT=/some/folder bash tests/device/gpu_checks.sh [CHECK ...]
#
# CHECK (default: all, in this order; each is logged, a failing one does not stop the others):
#   env      torch, the GPU, the Python packages varbench imports
#   latency  $LAT_MODEL (default var-d16, random weights), batch 1, CUDA events: dense vs magnitude 40 %
#            (first: weights and the working memory of two generations, which must agree within 1 %);
#            on CUDA then the same two with --cuda-graphs (per-scale CUDA graphs, bench/models/graphs.py;
#            eager against graphs in one alternation is the official check's third configuration);
#            with LAT_COMPILE=1 also dense under torch.compile (compile time reported apart; attention
#            and FFN compiled per scale shape, 21 graphs for var-d16: 46 s on 2 CPU cores, 15 s with inductor's cache
#            warm, 25.5 s on an H200)
#   official the official VAR sampler beside varbench's on the same weights and seeds (same tokens?
#            speed ratio); on CUDA varbench also with per-scale CUDA graphs, timed in the same
#            alternation; needs a FoundationVision/VAR checkout at $VAR_OFFICIAL (default .official/VAR,
#            e.g. `git --git-dir=<VAR's git dir> archive HEAD | tar -x -C .official/VAR`, the folder
#            ignored by git: it is never committed; the device tool's `carry` takes it along)
#   nccl     a sharded run under torchrun (NCCL, one process per GPU; skipped on one GPU: NCCL puts
#            no two ranks on a GPU) against the same run in one process: the metrics must be identical;
#            needs torch-fidelity (carry its wheel if missing). With DEVICE=cpu: 2 gloo processes
#   t2i      tiny-t2i trained on the GPU (background weight $T2I_BG, default 0.25) for as many steps as
#            fit $T2I_TRAIN_S seconds (default 300; the recipe's --time-budget: paced on its first 100
#            steps, at most $T2I_MAX_STEPS, default 60000), a quality-curve point every $T2I_EVAL_EVERY
#            steps (default 5000; 0: none), the quality bars measured at the end; one run per batch size
#            in $T2I_BATCHES (default "48", the recipe's), all at once on the one GPU (on an H200, three
#            at once ran batch 192 at 102 ms per step, alone at 49), each packed into $OUT/t2i-b<batch>.tar
#            (its manifest, the two trained files and its log); the text encoder first pretrained on the
#            scenes' 2×2 colour layouts for $T2I_PRETRAIN steps (default 1000; 0: none) and that loss kept
#            in the joint steps at weight $T2I_LAYOUT (default 1.0; bench/recipes/t2i_layout.py), the
#            loss reweighted by scale as Infinity's trainer does when T2I_REWEIGHT=1 (default), and the
#            first $T2I_COARSE steps (default 500) on the 1×1, 2×2 and 4×4 scales only; with T2I_COARSE > 0
#            the run is $T2I_STEPS steps (default 3200) instead of a time budget (coarse steps are faster,
#            so they cannot pace it). The shipped files' run: T2I_BATCHES=192 T2I_TRAIN_S=330
#            T2I_PRETRAIN=0 T2I_LAYOUT=0 T2I_REWEIGHT=0 T2I_COARSE=0
#
# From a session with the device tool: `OUT=$OUT bash tests/device/gpu_checks.sh env latency official` with
# carry [".official/VAR"] (the sampler checks of issue 9: eager, CUDA graphs and the official sampler).
#
# Time, measured on an H200: t2i takes about T2I_TRAIN_S + 1 minute (its data and latents, the final eval:
# 330 s gave 388 s for three runs at once, 170 s gave 211 s); env 7 s, official 21 s; latency with
# LAT_COMPILE=1 about 65 s (plus the memory pre-check). Run t2i in a call of its own (one call ≤ 10 minutes).
#
# Everything is written under $OUT (default ./gpu-checks): log.txt (all output), summary.txt (one line
# per check: ok / FAILED / skipped and its time; the numbers are in the log), latency/ (the latency
# records), t2i-b<batch>.tar (above): few files, as a device machine returns at most 8. DEVICE (default
# cuda) may be set to cpu to try the script's logic on a machine without a GPU (small: LAT_MODEL=tiny-var
# REPS=3 T2I_STEPS=2 T2I_COARSE=1 T2I_PRETRAIN=2 T2I_EVAL_EVERY=0; the t2i data still take minutes).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-checks}
DEVICE=${DEVICE:-cuda}
PY=${PY:-python3}
REPS=${REPS:-20}
LAT_MODEL=${LAT_MODEL:-var-d16}
LAT_COMPILE=${LAT_COMPILE:-0}
T2I_BG=${T2I_BG:-0.25}
T2I_TRAIN_S=${T2I_TRAIN_S:-300}
T2I_EVAL_EVERY=${T2I_EVAL_EVERY:-5000}
T2I_MAX_STEPS=${T2I_MAX_STEPS:-60000}
T2I_BATCHES=${T2I_BATCHES:-48}
T2I_PRETRAIN=${T2I_PRETRAIN:-1000}
T2I_LAYOUT=${T2I_LAYOUT:-1.0}
T2I_REWEIGHT=${T2I_REWEIGHT:-1}
T2I_COARSE=${T2I_COARSE:-500}
T2I_STEPS=${T2I_STEPS:-3200}
VAR_OFFICIAL=${VAR_OFFICIAL:-.official/VAR}
SCRATCH=$(mktemp -d)
mkdir -p "$OUT"
LOG="$OUT/log.txt"; SUMMARY="$OUT/summary.txt"
: >"$LOG"; : >"$SUMMARY"
export PYTHONUNBUFFERED=1
checks=("$@"); [ ${#checks[@]} -eq 0 ] && checks=(env latency official nccl t2i)

note() { echo "$*" | tee -a "$SUMMARY"; }
run() {   # run CMD...: its output into the log (and on screen), its status returned
    echo "+ $*" | tee -a "$LOG"
    "$@" 2>&1 | tr '\r' '\n' | grep -v -E '(it/s|s/it)\]$' | tee -a "$LOG"
    return "${PIPESTATUS[0]}"
}

check_env() {
    run "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(),
torch.cuda.get_device_name() if torch.cuda.is_available() else '')" || return 1
    run "$PY" - <<'EOF'
import importlib.util
need = ["torch", "numpy", "scipy", "yaml", "tqdm", "safetensors", "pandas", "jinja2", "matplotlib",
        "torch_fidelity", "cleanfid", "open_clip", "coremltools"]
missing = [m for m in need if importlib.util.find_spec(m) is None]
print("missing:", ", ".join(missing) or "none", "(the nccl check needs torch_fidelity)")
EOF
}

check_latency() {
    local res="$SCRATCH/latency"
    # the latency records' working memory (CUDA: the allocator's peak above its start) for two generations
    # after a warm-up: the same allocations, so the same figure; weights beside it
    run "$PY" - <<EOF || return 1
import torch
from bench.latency import weights_mb, working_mb
from bench.registry import MODELS
dev = "$DEVICE"
torch.manual_seed(0)
gen = MODELS.get("$LAT_MODEL").build(device=dev).eval()
labels = torch.zeros(1, dtype=torch.long, device=dev)
with torch.no_grad():
    gen.generate(labels, seed=0)                      # warm-up: the same allocations from here on
    work = [working_mb(lambda: gen.generate(labels, seed=0), dev) for _ in range(2)]
print(f"weights {weights_mb(gen, dev):.1f} MiB; working memory of one generation {work[0]:.2f} / {work[1]:.2f} MiB")
assert abs(work[0] - work[1]) <= 0.01 * work[0], "the same generation's working memory differs"
EOF
    run "$PY" -m bench latency --model "$LAT_MODEL" --random-weights --device "$DEVICE" --batch 1 --reps "$REPS" \
        --method dense --method magnitude:sparsity=0.4 --results "$res" --quiet || return 1
    keep_records "$res"
    if [ "$DEVICE" = cuda ]; then
        run "$PY" -m bench latency --model "$LAT_MODEL" --random-weights --device "$DEVICE" --batch 1 --reps "$REPS" \
            --method dense --method magnitude:sparsity=0.4 --cuda-graphs --results "$res" --quiet || return 1
        keep_records "$res"
    fi
    [ "$LAT_COMPILE" = 1 ] || return 0
    run "$PY" -m bench latency --model "$LAT_MODEL" --random-weights --device "$DEVICE" --batch 1 --reps "$REPS" \
        --method dense --compile --results "$res" --quiet
    local rc=$?
    keep_records "$res"
    return $rc
}

keep_records() {   # the records, flat under $OUT/latency (a device machine returns files ≤ 2 folders down)
    mkdir -p "$OUT/latency" && find "$1" -name '*.json' -exec cp {} "$OUT/latency/" \;
}

check_official() {
    if [ ! -d "$VAR_OFFICIAL" ]; then echo "no checkout at $VAR_OFFICIAL"; return 2; fi
    local graphs=(); [ "$DEVICE" = cuda ] && graphs=(--cuda-graphs)
    run "$PY" tests/fixtures/official/sampler_speed.py --official "$VAR_OFFICIAL" --device "$DEVICE" \
        --batch 1 --reps "$REPS" "${graphs[@]}"
}

check_nccl() {
    local n=120 single="$SCRATCH/single" sharded="$SCRATCH/sharded" procs
    if [ "$DEVICE" = cpu ]; then procs=2; else
        procs=$("$PY" -c "import torch; print(torch.cuda.device_count())")
        # a process group starts only with WORLD_SIZE > 1, and NCCL puts no two ranks on one GPU
        if [ "$procs" -lt 2 ]; then echo "nccl: $procs GPU(s); a sharded NCCL run needs at least 2"; return 2; fi
    fi
    run "$PY" -m bench run --model tiny-var --n $n --device "$DEVICE" --results "$single" --quiet || return 1
    run "$PY" -m torch.distributed.run --standalone --nproc_per_node="$procs" -m bench -- run --model tiny-var \
        --n $n --device "$DEVICE" --results "$sharded" --quiet || return 1
    run "$PY" - "$single" "$sharded" <<'EOF'
import json, sys
from pathlib import Path
recs = [json.loads(next(p for p in Path(d).rglob("*.json") if '"run_id"' in p.read_text()).read_text()) for d in sys.argv[1:]]
a, b = (r["metrics"] for r in recs)
print("metrics identical:", a == b, {k: a[k] for k in sorted(a)[:4]})
sys.exit(0 if a == b else 1)
EOF
}

check_t2i() {
    local b out length pids=() rc=0
    for b in $T2I_BATCHES; do   # one run per batch size, all at once
        out="$SCRATCH/t2i-b$b"
        mkdir -p "$out" && cp assets/tiny/manifest.json assets/tiny/tiny_bsq.safetensors "$out"/
        echo "+ t2i batch $b: log in t2i-b$b.tar" | tee -a "$LOG"
        if [ "$T2I_COARSE" -gt 0 ]; then
            length=(--steps "$T2I_STEPS" --coarse-first "$T2I_COARSE")
        else
            length=(--steps "$T2I_MAX_STEPS" --time-budget "$T2I_TRAIN_S")
        fi
        "$PY" -m bench.recipes.tiny_t2i --device "$DEVICE" --stages t2i,eval "${length[@]}" \
            --eval-every "$T2I_EVAL_EVERY" --background-weight "$T2I_BG" --batch "$b" \
            --text-pretrain "$T2I_PRETRAIN" --layout-weight "$T2I_LAYOUT" --reweight-by-scale "$T2I_REWEIGHT" \
            --out "$out" --no-progress >"$out/log.txt" 2>&1 &
        pids+=($!)
    done
    for b in $T2I_BATCHES; do
        out="$SCRATCH/t2i-b$b"
        if ! wait "${pids[0]}"; then
            { echo "t2i batch $b FAILED; the end of its log:"; tail -20 "$out/log.txt"; } | tee -a "$LOG"; rc=1
        fi
        pids=("${pids[@]:1}")
        rm -f "$out/tiny_bsq.safetensors"   # the shipped file, unchanged (its entry stays in the manifest)
        grep -E "^(time budget|text layout|step [0-9]+:|tiny-t2i quality|cross-attention)" "$out/log.txt" | sed "s/^/[b$b] /" | tee -a "$LOG"
        [ -f "$out/manifest.json" ] && run "$PY" -c "import json; e = json.load(open('$out/manifest.json'))['models']['tiny-t2i']; \
q = e.get('quality', {}); print('batch $b: steps', e['recipe']['steps'], 'train_seconds', e['train_seconds'], 'quality', \
{k: q.get(k) for k in ('single_object', 'two_object', 'counting', 'position')}, 'met', q.get('met'))"
        tar -cf "$OUT/t2i-b$b.tar" -C "$out" .
    done
    return $rc
}

for c in "${checks[@]}"; do
    if ! declare -F "check_$c" >/dev/null; then note "$c: unknown check (env latency official nccl t2i)"; continue; fi
    start=$(date +%s)
    "check_$c"; rc=$?
    secs=$(( $(date +%s) - start ))
    case $rc in
        0) note "$c: ok (${secs} s)";;
        2) note "$c: skipped (${secs} s; see log)";;
        *) note "$c: FAILED rc $rc (${secs} s; see log)";;
    esac
done
rm -rf "$SCRATCH"
cat "$SUMMARY"
