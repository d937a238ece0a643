# Sourced by the training recipes (train_env.sh, shipped_data.sh).
# bf16_flag OUT: prints --bf16 where this CPU multiplies bf16 natively (BF16=auto, the default), else nothing: emulated
# bf16 autocast makes an EAGLE-3 head's training step ~21x slower on 2 AVX2 cores (48 s against 2.2 s in fp32:
# benchmarks/train/eagle3_train_step.py). A run whose training folder exists keeps the precision it started with (its
# settings are checked on resume); BF16=0 / 1 forces it.
bf16_flag() {
  local bf16=${BF16:-auto}
  if [ "$bf16" = auto ] && [ -f "$1/train/job.json" ]; then
    bf16=$(.venv/bin/python -c "import json, sys; print(int(json.load(open(sys.argv[1]))['train']['bf16']))" \
      "$1/train/job.json")
  fi
  if [ "$bf16" = auto ]; then
    bf16=$(.venv/bin/python -c "from foretell.runtime.wide_linear import native_bf16; print(int(native_bf16()))")
  fi
  echo "$(basename "$0"): training in $([ "$bf16" = 1 ] && echo "bf16 (--bf16)" || echo fp32) for $1" >&2
  if [ "$bf16" = 1 ]; then echo --bf16; fi
}
