#!/usr/bin/env bash
# The GPU tier on a lent GPU machine that has Python, torch and the trainer's heavy dependencies but
# no network and no Ebbflow install: run from the repository root as `bash hack/gpu-check.sh`.
#
# 1. Installs the wheels carried in .whl/ (what that machine lacks: pydantic, cel-python and their
#    dependencies, for its CPython) into $SITE, and puts them and the source trees on PYTHONPATH.
# 2. Prints the GPUs and torch's view of them (failing without CUDA: a run of skipped tests is no
#    check), the versions of the main packages, and checks that the API, the trainer and the
#    examples import and build.
# 3. Runs the unit tests with CUDA parameters (band-limited convolutions on cuda, backend and
#    device resolution), then the gpu-marked trainer tier (tests/trainer -m gpu). Each pytest has
#    an overall limit and a per-test limit, so one hung test cannot eat the machine's time.
#
# Every step runs whatever failed before it; the exit status is non-zero when any step failed. With
# $OUT set, the whole output goes to $OUT/gpu-check.log too and the trainer tests' process logs,
# journals and progress reports to $OUT/trainer-logs/. PYTHON, SITE, GPU_CHECK_INSTALL=0 (use what
# is installed, as `make test-gpu` does with the venv) and the limits can be overridden.
#
# The wheels, fetched where pip works (CPython 3.12 there; the versions of .venv's `pip freeze`):
#   .venv/bin/python -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     pydantic pydantic-core annotated-types typing-inspection typing-extensions cel-python \
#     google-re2 jmespath lark pendulum tzdata
# (pin each to the venv's version; 4.2 MiB; used on an H200 with torch 2.11 on 2026-11-26).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
INSTALL=${GPU_CHECK_INSTALL:-1}
UNIT_LIMIT_S=${GPU_CHECK_UNIT_LIMIT_S:-75}
TRAINER_LIMIT_S=${GPU_CHECK_TRAINER_LIMIT_S:-300}
TEST_LIMIT_S=${GPU_CHECK_TEST_LIMIT_S:-150}
BASETEMP=${GPU_CHECK_BASETEMP:-/tmp/gpu-check-tmp}

export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH="$SITE:$ROOT/api:$ROOT/trainer-image:$ROOT/operator:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
failed=()
started=$SECONDS

step() { # step NAME COMMAND...: run it, report its status and time, remember a failure
	local name=$1 t0=$SECONDS code
	shift
	echo "=== $name"
	"$@"
	code=$?
	echo "=== $name: exit $code after $((SECONDS - t0)) s"
	((code == 0)) || failed+=("$name ($code)")
}

install_wheels() {
	local wheels=(.whl/*.whl)
	[[ -e "${wheels[0]}" ]] || {
		echo "no wheels in .whl/"
		return 1
	}
	mkdir -p "$SITE"
	"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
		--target "$SITE" "${wheels[@]}" && return 0
	echo "pip failed: unpacking the wheels into $SITE instead"
	"$PYTHON" - "$SITE" "${wheels[@]}" <<-'EOF'
		import sys, zipfile
		for wheel in sys.argv[2:]:
		    zipfile.ZipFile(wheel).extractall(sys.argv[1])
		    print("unpacked", wheel)
	EOF
}

show_device() { # fails without CUDA: every GPU test would skip, and a run of skips is no check
	nvidia-smi -L || echo "(nvidia-smi failed)"
	"$PYTHON" - <<-'EOF'
		import sys, torch
		print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
		if not torch.cuda.is_available():
		    sys.exit("CUDA is not available: every GPU test would skip")
		for index in range(torch.cuda.device_count()):
		    print(f"cuda:{index}", torch.cuda.get_device_name(index))
	EOF
}

imports() {
	"$PYTHON" - <<-'EOF'
		import importlib.metadata as md
		import ebbflow_api.models, ebbflow_trainer.launch.worker, ebbflow_trainer.launch.preload  # noqa: F401
		from ebbflow_trainer.api import load_spec
		for name in ("examples/digits/train.py", "examples/digits_cnn/train.py", "examples/hf_lm/train.py"):
		    load_spec(name)
		for dist in ("torch", "transformers", "numpy", "scikit-learn", "pydantic", "typing_extensions", "pytest"):
		    try:
		        print(dist, md.version(dist))
		    except md.PackageNotFoundError:
		        print(dist, "not found")
	EOF
}

collect_logs() { # the trainer tests' process logs and journals (small), for a failure's post-mortem
	[[ -n "${OUT:-}" && -d "$BASETEMP" ]] || return 0
	mkdir -p "$OUT/trainer-logs"
	(cd "$BASETEMP" && find . \( -name '*.log' -o -name '*.jsonl' -o -name progress.json \) -size -2M \
		-exec cp --parents {} "$OUT/trainer-logs/" \;) 2>/dev/null
	true
}

main() {
	if ((INSTALL)); then step "install wheels" install_wheels; fi
	step "device" show_device
	step "imports" imports
	step "unit tests with CUDA parameters" timeout -k 10 "$UNIT_LIMIT_S" "$PYTHON" -m pytest -p no:cacheprovider \
		tests/unit/trainer/test_trainer_bandlimit.py tests/unit/trainer/test_trainer_processes.py \
		-k cuda -q -rA --timeout "$TEST_LIMIT_S"
	rm -rf "$BASETEMP"
	step "gpu tier (tests/trainer -m gpu)" timeout -k 10 "$TRAINER_LIMIT_S" "$PYTHON" -m pytest -p no:cacheprovider \
		-m gpu tests/trainer -q -rA --durations=0 --timeout "$TEST_LIMIT_S" --basetemp "$BASETEMP"
	collect_logs

	echo "=== gpu-check: $((SECONDS - started)) s"
	if ((${#failed[@]})); then
		printf 'FAILED: %s\n' "${failed[@]}"
		return 1
	fi
	echo "gpu-check: every step passed"
}

if [[ -n "${OUT:-}" ]]; then
	mkdir -p "$OUT"
	main 2>&1 | tee "$OUT/gpu-check.log"
	exit "${PIPESTATUS[0]}"
fi
main
