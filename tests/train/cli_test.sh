#!/usr/bin/env bash
# End-to-end checks of `polyprobe train` and `polyprobe eval`: the default run reaches 90 %,
# saved weights evaluate to the same accuracy, and bad input fails with status 1, one error
# line naming the file, and no output file left behind.
set -uo pipefail
polyprobe=$1
fixtures=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$polyprobe" train --quiet --save run.safetensors --metrics m.jsonl) || fail "default train exited $?"
last=$(printf '%s\n' "$out" | tail -n 1)
[[ $last =~ ^test\ accuracy:\ ([0-9]+)\.[0-9]%$ ]] || fail "last line is '$last'"
(( BASH_REMATCH[1] >= 90 )) || fail "default accuracy $last is below 90%"
[[ -s run.safetensors && -s run.json && -s m.jsonl ]] || fail "missing outputs"
eval_last=$("$polyprobe" eval --weights run.safetensors | tail -n 1) || fail "eval failed"
[[ $eval_last == "$last" ]] || fail "eval says '$eval_last', train said '$last'"

# A config file, periodic validation and the restored best state named by its step.
printf 'epochs = 3\nvalidate-every = 10\nbatch = 256\n' > quick.ini
out=$("$polyprobe" train --quiet --config quick.ini --metrics v.jsonl) || fail "config train exited $?"
[[ $out =~ best\ validation\ accuracy:\ [0-9.]+%\ \(step\ [0-9]+,\ epoch\ [0-9]+,\ restored\) ]] ||
  fail "no restored best state in: $out"
# 1298 training rows in batches of 256: 6 steps an epoch, 18 in all; validated at 10 and 18.
(( $(grep -c '"split":"validation"' v.jsonl) == 2 )) || fail "expected 2 validations in v.jsonl"
"$polyprobe" train --quiet --validate-every -1 > /dev/null 2> err.txt
[[ $? == 2 ]] && grep -q "validate-every" err.txt || fail "--validate-every -1 is not a usage error"

expect_error() {  # expect_error NEEDLE ARGS...: status 1, NEEDLE on stderr, no out.safetensors
  local needle=$1; shift
  "$polyprobe" "$@" --save out.safetensors > /dev/null 2> err.txt
  local status=$?
  [[ $status == 1 ]] || fail "'$*' exited $status, expected 1"
  grep -q -- "$needle" err.txt || fail "'$*' error lacks '$needle': $(cat err.txt)"
  [[ $(wc -l < err.txt) == 1 ]] || fail "'$*' printed more than one error line"
  [[ ! -e out.safetensors && ! -e out.json ]] || fail "'$*' left output behind"
}
printf '1,2,0\n3,x,1\n' > bad.csv
expect_error "bad.csv', line 2, column 2" train --data bad.csv
printf '1,2,0\n3,4\n' > ragged.csv
expect_error "ragged.csv', line 2" train --data ragged.csv
printf '{"input_shape": [64], "layers": [{"kind": "conv2d", "out_channels": 2, "kernel_size": 3}]}' > chain.json
expect_error "layers\[0\] (conv2d)" train --model chain.json
printf '{"input_shape": [64],\n "layers": [\n' > truncated.json
expect_error "truncated.json': JSON syntax error at line 3" train --model truncated.json
printf '{"input_shape": [10], "layers": [{"kind": "linear", "out_features": 10}]}' > wide.json
expect_error "input_shape" train --model wide.json
printf '{"input_shape": [64], "layers": [{"kind": "linear", "out_features": 3}]}' > narrow.json
expect_error "out of range" train --model narrow.json
printf 'garbage' > bad.safetensors
"$polyprobe" eval --weights bad.safetensors --model run.json > /dev/null 2> err.txt
[[ $? == 1 ]] && grep -q "bad.safetensors" err.txt || fail "eval of a bad weights file"
"$polyprobe" eval --weights "$fixtures/linear.safetensors" --model run.json > /dev/null 2> err.txt
[[ $? == 1 ]] && grep -q "tensor" err.txt || fail "eval of weights of another model"
echo "all CLI checks passed"
