# Sourced by scripts/test.sh and fuzz/run.sh: points AddressSanitizer and
# UndefinedBehaviorSanitizer at an llvm-symbolizer (Debian's llvm-14, which
# `scripts/install-deps.sh --test` installs), so their reports name functions and source
# lines. Debian installs it as llvm-symbolizer-14, a name the sanitizers do not look for, and
# a path that does not exist makes them print "invalid path to external symbolizer", so
# only an existing one is set.
for candidate in "${ASAN_SYMBOLIZER_PATH:-}" /usr/lib/llvm-14/bin/llvm-symbolizer \
  "$(command -v llvm-symbolizer 2> /dev/null || true)"; do
  if [[ -n $candidate && -x $candidate ]]; then
    export ASAN_SYMBOLIZER_PATH=$candidate UBSAN_SYMBOLIZER_PATH=$candidate
    break
  fi
done
unset candidate
