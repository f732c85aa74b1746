#!/usr/bin/env bash
# usage: readme_paths.sh SOURCE_DIR
# Every repository path the README names in backquotes exists (the layout table, the plugin
# section), and the SDK headers its layout table lists are those in include/polyprobe/plugin/.
set -euo pipefail
src=$1
cd "$src"
status=0
while read -r path; do
  path=${path%/}
  if [[ ! -e $path ]]; then echo "README.md names $path, which does not exist"; status=1; fi
done < <(grep -o '`[^` ]*`' README.md | tr -d '`' |
         grep -E '^(include|core|plugins|apps|tests|examples|docs|scripts|python|cmake)/' |
         grep -v '[<*$]' | sort -u)
row=$(grep -E '^\| `include/polyprobe/` \|' README.md)
for header in abi.h ops.h plugin.hpp kernels/; do
  [[ $row == *"\`$header\`"* ]] || { echo "README's layout row lacks $header"; status=1; }
  [[ -e include/polyprobe/plugin/$header ]] || { echo "no include/polyprobe/plugin/$header"; status=1; }
done
exit $status
