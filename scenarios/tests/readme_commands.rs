//! Every command the docs give runs in CI: each row of the guide's command reference
//! (docs/guide.md, `## Command reference`) has a `row '...'` entry (its first cell, verbatim) in
//! `.ci/smoke`, which runs the row's commands at a small size and fails on a panic or an
//! unexpected exit code; and every subcommand the README's "What to run next" names is one of
//! those rows. A row added without a smoke entry, a smoke entry whose row is gone or reworded,
//! or a README command the reference does not have, fails here.

use std::collections::BTreeSet;
use std::path::Path;

fn repo_file(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("cannot read {}: {e}", full.display()))
}

/// The first cells of the table under the heading `## {heading}` of `doc`, header and rule
/// excluded.
fn table_rows(doc: &str, heading: &str) -> Vec<String> {
    let section = doc
        .split(&format!("\n## {heading}"))
        .nth(1)
        .unwrap_or_else(|| panic!("no `## {heading}` section"));
    let section = section.split("\n## ").next().unwrap_or(section);
    section
        .lines()
        .filter(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| first_cell(l).to_owned())
        .collect()
}

/// The first cell of a Markdown table row (a `|` inside backticks does not end it).
fn first_cell(line: &str) -> &str {
    let body = &line[1..];
    let mut in_code = false;
    for (i, c) in body.char_indices() {
        match c {
            '`' => in_code = !in_code,
            '|' if !in_code => return body[..i].trim(),
            _ => {}
        }
    }
    body.trim()
}

/// The rows `.ci/smoke` runs: the argument of each `row '...'` line.
fn smoke_rows(smoke: &str) -> Vec<String> {
    smoke
        .lines()
        .filter_map(|l| l.strip_prefix("row '"))
        .map(|rest| {
            rest.strip_suffix('\'')
                .unwrap_or_else(|| panic!("a `row` line must be `row '...'`: row '{rest}"))
                .to_owned()
        })
        .collect()
}

/// The reference's rows: the first cells of the guide's command reference.
fn reference_rows() -> Vec<String> {
    table_rows(&repo_file("docs/guide.md"), "Command reference")
}

/// The `scenario` subcommands a first cell names (`scenario ids`, `scenario tcc` → ids, tcc).
fn subcommands(cell: &str) -> Vec<String> {
    cell.split('`')
        .filter_map(|code| code.trim().strip_prefix("scenario "))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_readme_command_is_in_the_guides_reference() {
    let reference: BTreeSet<String> = reference_rows()
        .iter()
        .flat_map(|row| subcommands(row))
        .collect();
    let readme = table_rows(&repo_file("README.md"), "What to run next");
    assert!(
        readme.len() >= 5,
        "the README table looks truncated: {readme:?}"
    );
    for row in &readme {
        let named = subcommands(row);
        assert!(
            !named.is_empty(),
            "README row names no `scenario` command: {row}"
        );
        for sub in named {
            // `scenario NAME` and `scenario list` stand for the named scenarios' rows.
            let known = reference.contains(&sub)
                || reference.contains("NAME")
                    && repo_file("docs/guide.md").contains(&format!("`{sub}`"));
            assert!(
                known,
                "README command `scenario {sub}` is not in the guide's reference"
            );
        }
    }
}

#[test]
fn every_reference_row_runs_in_the_ci_smoke_script() {
    let readme = reference_rows();
    let smoke = smoke_rows(&repo_file(".ci/smoke"));
    assert!(
        readme.len() >= 10,
        "the command reference looks truncated: {readme:?}"
    );
    let readme_set: BTreeSet<&String> = readme.iter().collect();
    let smoke_set: BTreeSet<&String> = smoke.iter().collect();
    let missing: Vec<_> = readme_set.difference(&smoke_set).collect();
    let stale: Vec<_> = smoke_set.difference(&readme_set).collect();
    assert!(
        missing.is_empty(),
        "command reference rows with no smoke run in .ci/smoke (add `row '<first cell>'` and its commands): {missing:#?}"
    );
    assert!(
        stale.is_empty(),
        ".ci/smoke rows that are not in the command reference (reworded or removed?): {stale:#?}"
    );
    assert_eq!(
        smoke.len(),
        smoke_set.len(),
        "a row appears twice in .ci/smoke"
    );
}

#[test]
fn ci_runs_the_smoke_script() {
    let run = repo_file(".ci/run");
    assert!(
        run.lines()
            .any(|l| l.trim_start().starts_with("bash .ci/smoke")),
        ".ci/run must run .ci/smoke"
    );
}

#[test]
fn the_row_parser_sees_a_new_row_and_keeps_pipes_in_code() {
    let readme = "intro\n## Command reference\n\n| command | what |\n|---|---|\n\
                  | `a \\| b` | x |\n| `scenario new` | y |\n\n## Next\n| `other` | z |\n";
    let readme_rows = |doc: &str| table_rows(doc, "Command reference");
    assert_eq!(readme_rows(readme), ["`a \\| b`", "`scenario new`"]);
    let smoke = "row '`a \\| b`'\nexpect 0 true\n";
    let rows = smoke_rows(smoke);
    let missing: Vec<_> = readme_rows(readme)
        .into_iter()
        .filter(|r| !rows.contains(r))
        .collect();
    assert_eq!(missing, ["`scenario new`"], "an unlisted row is reported");
    assert_eq!(
        subcommands("`scenario ids`, `scenario tcc --url U` and `x`"),
        ["ids", "tcc"]
    );
}
