#!/usr/bin/env bash
# usage: no_history_names.sh SOURCE_DIR
# No project file describes how it was developed instead of what it is: a development session
# or an issue of the project's tracker named by its number, or a machine that was lent for a
# while, in the docs, the README, sources, scripts or tests (the pattern below).
# History lives in git log. A reference to another project's tracker names that project
# (e.g. "NLopt issue #370") and is allowed.
set -euo pipefail
src=$1
cd "$src"
pattern='\b(sessions?[ -][0-9]+|issues? #?[0-9]+|lent)\b'
upstream='\b(NLopt|PyTorch|Eigen|oneTBB|TBB|CUDA|NCCL|OpenMPI|pybind11|CMake|GCC|LLVM|Catch2) issues? #?[0-9]+'
paths=(README.md docs scripts tests core include plugins distributed apps python examples fuzz
       bench cmake tools CMakeLists.txt CMakePresets.json .ci)
if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  count=$(git ls-files -- "${paths[@]}" | wc -l)
  hits=$(git grep -nIiE "$pattern" -- "${paths[@]}" ':!tests/scripts/no_history_names.sh' || true)
else  # a source tree without git: the same paths, build outputs left out
  existing=()
  for p in "${paths[@]}"; do [[ -e $p ]] && existing+=("$p"); done
  count=$(find "${existing[@]}" -type f | wc -l)
  hits=$(grep -rnIiE "$pattern" --exclude=no_history_names.sh --exclude-dir='build*' \
    "${existing[@]}" || true)
fi
((count > 50)) || { echo "FAIL: only $count files found under $src"; exit 1; }
found=0
while IFS= read -r hit; do
  [[ -z $hit ]] && continue
  file=${hit%%:*}
  rest=${hit#*:}
  line=${rest%%:*}
  text=${rest#*:}
  # Another project's issue ("NLopt issue #370") is a citation, not this project's history.
  printf '%s' "$text" | sed -E "s/$upstream//g" | grep -qiE "$pattern" || continue
  echo "$file:$line: names a development session, an issue of this project or a lent machine:"
  echo "    ${text:0:200}"
  found=$((found + 1))
done <<< "$hits"
if ((found)); then
  echo "FAIL: $found line(s) above describe the project's history; say what the software does" \
    "now (history lives in git log)"
  exit 1
fi
echo "ok: $count files name no development session, issue number or lent machine"
