#!/usr/bin/env bash
# End-to-end checks of `polyprobe train` and `polyprobe eval`: the default run reaches 90 %,
# saved weights evaluate to the same accuracy, and bad input fails with status 1, one error
# line naming the file, and no output file left behind.
#
#   cli_test.sh POLYPROBE FIXTURES FIXTURE_PLUGIN_DIR   every check but the terminal's
#   cli_test.sh --progress-tty POLYPROBE                the progress bar on a 60-column
#       terminal; exits 77 (a skip, with the reason) where `script` cannot open a
#       pseudo-terminal, as in some containers
set -uo pipefail
fail() { echo "FAIL: $*" >&2; exit 1; }
if [[ ${1:-} == --progress-tty ]]; then
  polyprobe=$2
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  cd "$work"
  command -v script > /dev/null || { echo "SKIP: no \`script\` (bsdutils) to open a terminal"; exit 77; }
  if ! probe=$(script -qc "stty cols 60 && echo pty-ok" /dev/null 2>&1) || [[ $probe != *pty-ok* ]]; then
    echo "SKIP: \`script\` cannot open a pseudo-terminal here: ${probe:0:200}"
    exit 77
  fi
  # Every redraw fits (no wrapped lines) and shows the epoch's running means and an ETA.
  script -qc "stty cols 60; $polyprobe train --epochs 2 2>&1 > /dev/null" /dev/null > tty.txt ||
    fail "train on a terminal exited $?: $(tail -c 300 tty.txt)"
  redraws=$(tr '\r' '\n' < tty.txt | sed 's/\x1b\[K//g')
  widest=$(awk '{ if (length($0) > w) w = length($0) } END { print w + 0 }' <<< "$redraws")
  ((widest > 20 && widest < 60)) ||
    fail "progress lines up to $widest columns on a 60-column terminal: $(tail -c 300 tty.txt)"
  grep -q "  acc [0-9.]*%.*eta [0-9]*s" <<< "$redraws" && ! grep -q "batch acc" <<< "$redraws" ||
    fail "progress line: $(tail -n 2 <<< "$redraws")"
  echo "progress bar checks passed"
  exit 0
fi
polyprobe=$1
fixtures=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

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

# The user's files. An input is never overwritten: --save beside the --model file refuses,
# before any work, and leaves the model file as it was.
printf '{"description": "mine", "input_shape": [64], "layers": [{"kind": "linear", "out_features": 10}]}' > mine.json
cp mine.json mine.orig
out=$("$polyprobe" train --quiet --model mine.json --save mine.safetensors 2> err.txt)
[[ $? == 2 ]] && grep -q "'mine.json' is the --model input" err.txt || fail "--save over --model: $(cat err.txt)"
cmp -s mine.json mine.orig && [[ -z $out && ! -e mine.safetensors ]] || fail "mine.json was touched"
"$polyprobe" train --quiet --data bad.csv --metrics bad.csv > /dev/null 2> err.txt
[[ $? == 2 ]] && grep -q "is the --data input" err.txt || fail "--metrics over --data: $(cat err.txt)"
# Every output is checked before any work (no "data:" line), naming the path given.
out=$("$polyprobe" train --quiet --save nodir/x.safetensors 2> err.txt)
[[ $? == 1 && -z $out ]] || fail "--save into a missing folder: '$out'"
grep -q "nodir/x.safetensors'.*does not exist" err.txt && ! grep -q "\.tmp\." err.txt ||
  fail "--save into a missing folder: $(cat err.txt)"
"$polyprobe" train --quiet --metrics nodir/m.jsonl > /dev/null 2> err.txt
[[ $? == 1 ]] && grep -q "metrics file 'nodir/m.jsonl'" err.txt || fail "--metrics: $(cat err.txt)"

# Ctrl-C saves the best weights so far beside the checkpoint; eval reads them and --resume
# says which step it continues from.
"$polyprobe" train --quiet --epochs 1000 --validate-every 4 --save int.safetensors \
  --metrics int.jsonl > int.out 2>&1 &
pid=$!
for _ in $(seq 300); do grep -q '"split":"validation"' int.jsonl 2> /dev/null && break; sleep 0.1; done
kill -INT "$pid"
wait "$pid"
status=$?
[[ $status == 130 ]] || fail "interrupted train exited $status: $(cat int.out)"
[[ $(cat int.out) =~ interrupted\ at\ step\ ([0-9]+)\;\ saved\ the\ best\ weights\ so\ far ]] ||
  fail "interrupt message: $(cat int.out)"
stopped=${BASH_REMATCH[1]}
[[ -s int.safetensors && -s int.json && -s int.safetensors.ckpt ]] || fail "interrupt left no weights"
"$polyprobe" eval --weights int.safetensors > /dev/null || fail "eval of the interrupted weights"
out=$("$polyprobe" train --quiet --epochs 1 --save int.safetensors --resume) || fail "resume exited $?"
grep -q "^resuming from step $stopped (epoch " <<< "$out" || fail "resume does not name step $stopped: $out"

# Data too small for its splits: a usage error before training that says what to change, and
# no accuracy over zero samples.
printf '1,2,0\n4,3,1\n' > two.csv
"$polyprobe" train --quiet --data two.csv > /dev/null 2> err.txt
[[ $? == 2 ]] && grep -q "2 samples: --validation-fraction 0.15 leaves the validation split empty" err.txt ||
  fail "empty validation split: $(cat err.txt)"
"$polyprobe" train --quiet --data two.csv --validation-fraction 0 > /dev/null 2> err.txt
[[ $? == 2 ]] && grep -q "2 samples: --test-fraction 0.15 leaves the test split empty" err.txt ||
  fail "empty test split: $(cat err.txt)"
out=$("$polyprobe" train --quiet --data two.csv --test-fraction 0 --validation-fraction 0 --epochs 1 2> err.txt) ||
  fail "two.csv without splits exited $?: $(cat err.txt)"
grep -q "best training-split accuracy (no validation split)" <<< "$out" && grep -q "^no test split" <<< "$out" &&
  ! grep -q "validation accuracy" <<< "$out" || fail "accuracy over an empty split: $out"
grep -q "^trained 1 step (1 epoch, " <<< "$out" || fail "summary not pluralised: $out"
grep -q "warning: --batch 128 is larger than the training split (2 samples)" err.txt ||
  fail "no warning for --batch: $(cat err.txt)"
for bad in "--time-limit -1" "--hidden 0" "--epochs 0" "--patience -1" "--test-fraction 1.5"; do
  "$polyprobe" train --quiet $bad > /dev/null 2> err.txt
  [[ $? == 2 && $(wc -l < err.txt) == 1 ]] || fail "'$bad' is not a one-line usage error: $(cat err.txt)"
done

# Non-finite losses: a model that writes NaN everywhere stops at the first step, naming the
# layer and the plugin that provides it.
mkdir nanplug && cp "$3/libpolyprobe_fixture_nan_layer.so" nanplug/
printf '{"input_shape": [64], "layers": [{"kind": "nan_shift"}, {"kind": "linear", "out_features": 10}]}' > nan.json
expect_error "step 1.*layers\[0\] (nan_shift).*plugin 'fixture_nan_layer'" train --quiet --model nan.json --plugin-dir nanplug

# train --explain says when a layer's declared contract was not trusted, and why.
printf '{"input_shape": [64], "layers": [{"kind": "nan_shift", "max_moved": 1000000, "claim_elementwise": true}, {"kind": "linear", "out_features": 10}]}' > liar.json
"$polyprobe" train --quiet --explain --epochs 1 --model liar.json --plugin-dir nanplug 2> liar.err > /dev/null ||
  fail "train with a false contract failed: $(tail -n 3 liar.err)"
grep -q "layer 0 (nan_shift): declared contract not trusted: declared elementwise but has parameters" liar.err ||
  fail "train --explain does not say the contract was not trusted: $(cat liar.err)"
echo "all CLI checks passed"
