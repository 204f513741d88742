#!/bin/sh
# Runs every Go fuzz target of the module for a bounded time each
# (FUZZTIME, default 3s), one at a time. Targets are discovered with
# `go test -list '^Fuzz'` in every package whose tests declare one, so a
# new target is never forgotten. A plain `go test` already runs each
# target's seed corpus (f.Add and testdata/fuzz/); this adds the mutation.
# A crasher is written to <package>/testdata/fuzz/<Target>/ by go test:
# commit it with the fix, so the unit run keeps replaying it.
#
# FUZZTIME=0 lists the targets and exits; FUZZ_PARALLEL sets the fuzzing
# workers per target (default: go's, GOMAXPROCS). New inputs are minimized
# for at most FUZZMINIMIZE (default 100x): go's default, 60 s per input,
# spent most of a few-second budget minimizing instead of fuzzing.
set -eu
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-3s}
FUZZMINIMIZE=${FUZZMINIMIZE:-100x}
cd "$(dirname "$0")/.."

# Packages whose test files declare a fuzz target (a fast pre-filter:
# `go test -list` then confirms and names the targets).
pkgs=$(grep -rl --include='*_test.go' -E '^func Fuzz[A-Z0-9_a-z]*\(f \*testing\.F\)' . |
	xargs -n1 dirname | sort -u | sed 's|^\./||; s|^|./|')
[ -n "$pkgs" ] || { echo "fuzz: no fuzz targets found" >&2; exit 1; }

targets=""
for p in $pkgs; do
	names=$($GO test -list '^Fuzz' "$p" | grep '^Fuzz' || true)
	if [ -z "$names" ]; then
		echo "fuzz: $p declares a fuzz target but go test -list finds none (build tag?)" >&2
		exit 1
	fi
	for n in $names; do targets="$targets $p:$n"; done
done
count=$(echo $targets | wc -w)
echo "fuzz: $count targets, $FUZZTIME each"
[ "$FUZZTIME" != 0 ] || { for t in $targets; do echo "  $t"; done; exit 0; }

par=""
[ -z "${FUZZ_PARALLEL:-}" ] || par="-parallel=$FUZZ_PARALLEL"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s)
failed=""
for t in $targets; do
	p=${t%%:*} n=${t#*:}
	t0=$(date +%s)
	ok=0
	for try in 1 2; do
		if $GO test -count=1 -run '^$' -fuzz "^$n\$" -fuzztime="$FUZZTIME" -fuzzminimizetime="$FUZZMINIMIZE" $par "$p" >"$log" 2>&1; then
			ok=1
			break
		fi
		# go's fuzzing engine can end a run with a bare "context deadline
		# exceeded" when -fuzztime runs out while a worker is still
		# minimizing a new (not crashing) input: no failing input is
		# written then. That is the engine's, not the target's; run it once
		# more and say so. A real failure always writes its input.
		if [ "$try" = 1 ] && grep -q 'context deadline exceeded' "$log" && ! grep -q 'Failing input written to' "$log"; then
			echo "  $t: go's fuzzing engine stopped on its own deadline without a failing input; running it again" >&2
			continue
		fi
		break
	done
	if [ "$ok" = 0 ]; then
		cat "$log"
		failed="$failed $t"
	else
		echo "  ok $t ($(($(date +%s) - t0)) s)"
	fi
done
echo "fuzz: $count targets in $(($(date +%s) - start)) s"
if [ -n "$failed" ]; then
	echo "fuzz: FAILED:$failed (crashers are in <package>/testdata/fuzz/<Target>/)" >&2
	exit 1
fi
