#!/usr/bin/env bash
# Opens each HTML report in headless Chromium and checks that it renders: Chromium parses the
# page into a DOM with the report's title, every inline SVG chart of the file survives parsing,
# the page loads nothing from the network, and a screenshot can be taken.
#
#   bash .ci/html_check.sh REPORT_DIR...            (each holding an index.html)
#   SCREENSHOTS=docs/screenshots bash .ci/html_check.sh ...   (also keep the screenshots there,
#                                                              named after each folder)
#
# Installs Debian's `chromium` with apt-get when it is missing (CI runs as root).
set -euo pipefail

[ $# -gt 0 ] || { echo "html_check: name at least one report folder" >&2; exit 2; }

browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
    browser=$(command -v chromium)
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

for dir in "$@"; do
    page="$dir/index.html"
    name=$(basename "$dir")
    if [ ! -s "$page" ]; then
        echo "html_check: FAIL $page: no report"
        failures=$((failures + 1))
        continue
    fi
    url="file://$(realpath "$page")"
    flags=(--headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$work/profile"
           --virtual-time-budget=2000)
    dom="$work/$name.dom"
    "$browser" "${flags[@]}" --dump-dom "$url" >"$dom" 2>"$work/$name.log" || true
    shot="$work/$name.png"
    "$browser" "${flags[@]}" --window-size=1280,1800 --screenshot="$shot" "$url" \
        >>"$work/$name.log" 2>&1 || true
    svgs_file=$( (grep -o '<svg' "$page" || true) | wc -l)
    svgs_dom=$( (grep -o '<svg' "$dom" || true) | wc -l)
    title=$(sed -n 's:.*<title>\([^<]*\)</title>.*:\1:p' "$page" | head -n 1)
    problems=()
    grep -q '<h1' "$dom" || problems+=("no <h1> in the rendered DOM")
    [ -n "$title" ] && ! grep -qF "$title" "$dom" && problems+=("the title \"$title\" is not rendered")
    [ "$svgs_dom" -eq "$svgs_file" ] || problems+=("$svgs_file SVG charts in the file, $svgs_dom after parsing")
    grep -Eq '(src|href)="(https?:)?//' "$page" && problems+=("the page loads something from the network")
    [ -s "$shot" ] || problems+=("no screenshot")
    if [ ${#problems[@]} -gt 0 ]; then
        echo "html_check: FAIL $page:"
        printf '  %s\n' "${problems[@]}"
        tail -n 5 "$work/$name.log" | sed 's/^/  | /'
        failures=$((failures + 1))
    else
        echo "html_check: ok   $page ($svgs_dom charts, title \"$title\")"
    fi
    if [ -n "${SCREENSHOTS:-}" ] && [ -s "$shot" ]; then
        mkdir -p "$SCREENSHOTS"
        cp "$shot" "$SCREENSHOTS/$name.png"
    fi
done

[ "$failures" -eq 0 ] || { echo "html_check: $failures report(s) failed"; exit 1; }
echo "html_check: every report renders in headless Chromium"
