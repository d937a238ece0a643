#!/usr/bin/env bash
# llama.cpp's own binaries, llama-server and llama-bench, as foretell's benchmark peer (`foretell bench` methods
# llama-cpp and llama-cpp-draft; the llama-server rows of benchmarks/serve/serve_batching.py).
# Source: the llama.cpp tree vendored in the llama-cpp-python sdist, a pinned release on the package index, so
# nothing but pip reaches the network. Built static (no shared libraries to find) into .venv/bin: about 10 minutes
# on 2 cores. The native build (-march=native, what a user building here gets) is kept when a llama-bench smoke test
# passes, else it is rebuilt with exactly the x86 extensions /proc/cpuinfo lists and AMX off. On a CPU with AMX
# (amx_int8) the native attempt is skipped: this llama.cpp's AMX int8 kernel dies there (see amx_skip below), so
# only the AVX-512 build is made. The build kept and its cmake flags go to .venv/share/foretell-llama-cpp.json,
# which the benchmarks record beside their llama.cpp results.
#   bash scripts/install_llama_cpp.sh        then: foretell bench --methods plain,llama-cpp ...
#   FORCE=1 rebuilds; LLAMA_CPP_BUILD=auto (default) | native (try native even on AMX) | portable (skip native);
#   JOBS=N compile jobs (default: all cores); PLAN_ONLY=1 prints the build it would make and its flags, then exits.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.3.36  # llama-cpp-python release whose vendored llama.cpp is built
BIN=.venv/bin
INFO=.venv/share/foretell-llama-cpp.json
JOBS=${JOBS:-$(nproc)}
say() { echo "install_llama_cpp: $*" >&2; }
die() { say "error: $*"; exit 1; }

CPUINFO=${CPUINFO:-/proc/cpuinfo}  # where the CPU's extensions are read (a test points it at a fixture)
cpu_flags() { echo " $(grep -m1 '^flags' "$CPUINFO" | cut -d: -f2) "; }

portable_flags() {  # the x86 extensions this CPU has, each as its GGML option; AMX always off
  local have flag option
  have=$(cpu_flags)
  echo -DGGML_NATIVE=OFF
  for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI avx512f:AVX512 \
              avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    flag=${pair%%:*} option=${pair#*:}
    if [[ $have == *" $flag "* ]]; then echo "-DGGML_$option=ON"; else echo "-DGGML_$option=OFF"; fi
  done
  echo -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF | tr ' ' '\n'
}

amx_skip="this CPU has AMX (amx_int8 in $CPUINFO), so the native build is skipped: the llama.cpp vendored in \
llama-cpp-python $VERSION dies with SIGILL in prompt processing there, in its own AMX int8 kernel (a tileloadd in \
tinygemm_kernel_amx<block_q8_1, block_q4_1>), even when Linux has granted the process the tile permission \
(arch_prctl ARCH_REQ_XCOMP_PERM): a bug of that llama.cpp version, not a missing permission. Building once with this \
CPU's extensions up to AVX-512 and AMX off: that AVX-512 build is the peer foretell is measured against. \
LLAMA_CPP_BUILD=native tries the native build anyway."
BUILD=${LLAMA_CPP_BUILD:-auto} why=
case $BUILD in
  auto) if [[ $(cpu_flags) == *" amx_int8 "* ]]; then BUILD=portable why=$amx_skip; else BUILD=native; fi ;;
  native|portable) ;;
  *) die "LLAMA_CPP_BUILD is auto, native or portable, not '$BUILD'" ;;
esac
if [ "${PLAN_ONLY:-0}" = 1 ]; then  # nothing is built or installed
  [ -z "$why" ] || say "$why"
  echo "build: $BUILD"
  if [ "$BUILD" = portable ]; then portable_flags; else echo -DGGML_NATIVE=ON; fi
  exit 0
fi

bash scripts/setup.sh
GGUF=$(.venv/bin/python -c "from foretell.models.presets import PRESETS, locate_single_gguf
print(locate_single_gguf(PRESETS['smollm2-135m']))")

smoke() {  # $1: folder with llama-bench. A short prompt-processing and decode run; fails on any crash. Its speeds
           # only show it runs: a busy machine (or this script's `nice`) can slow them many times.
  "$1/llama-bench" -m "$GGUF" -p 64 -n 8 -r 1 -t "$JOBS"
}

if [ "${FORCE:-0}" != 1 ] && [ -x $BIN/llama-server ] && [ -x $BIN/llama-bench ] &&
   grep -q "\"version\": \"$VERSION\"" $INFO 2>/dev/null && $BIN/llama-server --version >/dev/null 2>&1 &&
   smoke $BIN >/dev/null 2>&1; then
  say "llama.cpp from llama-cpp-python $VERSION is already installed and works ($(grep -o '"build": "[a-z]*"' $INFO));" \
      "FORCE=1 rebuilds"
  exit 0
fi

# Tools: cmake, a C++ compiler, make. As root on Debian they are installed; otherwise the message says what.
missing=()
for tool in cmake c++ make; do command -v $tool >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing cmake g++ make with apt-get (missing: ${missing[*]})"
    apt-get update -qq && apt-get install -y -qq cmake g++ make >&2
  else
    die "missing ${missing[*]}; install them first (Debian/Ubuntu: sudo apt-get install cmake g++ make)"
  fi
fi

WORK=${TMPDIR:-/tmp}/foretell-llama-cpp-$VERSION  # outside any git tree: llama.cpp's build reads git for its version
SRC=$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp
mkdir -p "$WORK"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  say "downloading the llama-cpp-python $VERSION sdist (about 75 MB)"
  .venv/bin/python -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK"
  tar -xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
fi

COMMON=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
        -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF)  # loopback HTTP only; the web UI would be fetched
NATIVE=(-DGGML_NATIVE=ON)

build() {  # $1: build name; the rest: its cmake flags. Prints the folder holding the binaries.
  local name=$1 dir=$WORK/build-$1 log=$WORK/build-$1.log
  shift
  say "configuring the $name build: $*"
  cmake -S "$SRC" -B "$dir" "${COMMON[@]}" "$@" >"$log" 2>&1 || { tail -30 "$log" >&2; die "cmake failed (log: $log)"; }
  say "compiling llama-server and llama-bench ($name, $JOBS jobs, about 10 minutes on 2 cores; log: $log)"
  # Only the percentage lines reach the terminal, once each.
  cmake --build "$dir" -j "$JOBS" --target llama-server llama-bench 2>&1 | tee -a "$log" |
    awk -v tag="$name" '/^\[ *[0-9]+%\]/ { p = $0; sub(/\].*/, "]", p)
      if (p != last) { print "install_llama_cpp: " tag " " p > "/dev/stderr"; fflush("/dev/stderr"); last = p } }' ||
    { tail -30 "$log" >&2; die "the $name build failed (log: $log)"; }
  echo "$dir/bin"
}

kept= flags=()
[ -z "$why" ] || say "$why"
if [ "$BUILD" = native ]; then
  out=$(build native "${NATIVE[@]}")
  say "smoke test: llama-bench -p 64 -n 8 on $(basename "$GGUF")"
  if smoke "$out" >&2; then
    kept=native flags=("${NATIVE[@]}")
  else
    say "the native build failed its smoke test (status $?; SIGILL is 132); rebuilding with explicit flags"
  fi
fi
if [ -z "$kept" ]; then
  mapfile -t flags < <(portable_flags)
  out=$(build portable "${flags[@]}")
  say "smoke test: llama-bench -p 64 -n 8 on $(basename "$GGUF")"
  smoke "$out" >&2 || die "the portable build failed its smoke test too; see the output above"
  kept=portable
fi

for exe in llama-server llama-bench; do
  if ldd "$out/$exe" | grep -E 'not found|libllama|libggml|libmtmd' >&2; then
    die "$exe links shared libraries from its build folder; it must be static"
  fi
  install -m 755 "$out/$exe" "$BIN/$exe"
done
mkdir -p "$(dirname $INFO)"
.venv/bin/python - "$INFO" "$VERSION" "$kept" "${COMMON[@]}" "${flags[@]}" <<'EOF'
import json, platform, subprocess, sys
path, version, build, *flags = sys.argv[1:]
cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
server = subprocess.run([".venv/bin/llama-server", "--version"], capture_output=True, text=True)
info = {"version": version, "source": f"llama-cpp-python {version} sdist, vendor/llama.cpp", "build": build,
        "cmake_flags": flags, "cpu": cpu, "machine": platform.machine(),
        "llama_server_version": (server.stdout + server.stderr).strip().splitlines()}
open(path, "w").write(json.dumps(info, indent=1) + "\n")
EOF
say "kept the $kept build (${flags[*]}); llama-server and llama-bench are in $BIN, build notes in $INFO"
rm -rf "$WORK/build-native" "$WORK/build-portable"  # hundreds of MB; the unpacked source stays for a rebuild
