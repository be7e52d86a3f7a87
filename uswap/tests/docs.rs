//! The documentation as a reader of a fresh clone meets it: the README stays a front door
//! (at most 250 lines), and no relative link in the Markdown files leaves the repository or
//! points at a file that is not there. (The README's Rust example is compiled and run as a
//! doc test of the `uswap` crate.)

use std::path::{Path, PathBuf};

const README_MAX_LINES: usize = 250;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf()
}

/// The Markdown files a reader follows: the README, BENCHMARKS.md, and everything under
/// `docs/` and `probes/`.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md"), root.join("BENCHMARKS.md")];
    for dir in ["docs", "docs/bench", "probes", "uswap-py"] {
        let entries = std::fs::read_dir(root.join(dir)).unwrap_or_else(|e| panic!("{dir}: {e}"));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.extension().is_some_and(|x| x == "md") {
                files.push(path);
            }
        }
    }
    files
}

/// The targets of `[text](target)` links outside code blocks and code spans.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut in_fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        // Drop code spans, whose brackets are not links.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            targets.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    targets
}

#[test]
fn the_readme_is_a_front_door_of_at_most_250_lines() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let nr_lines = readme.lines().count();
    assert!(nr_lines <= README_MAX_LINES, "README.md has {nr_lines} lines, more than {README_MAX_LINES}");
    for target in link_targets(&readme) {
        assert!(!target.contains("://"), "README.md links outside the repository: {target}");
    }
}

#[test]
fn every_relative_link_in_the_documentation_stays_in_the_repository_and_resolves() {
    let root = repo().canonicalize().expect("the workspace root");
    let mut nr_links = 0;
    for file in markdown_files(&root) {
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(!text.contains("../shared/"), "{} points at ../shared/, which a clone does not have", file.display());
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with('#') || target.starts_with("mailto:") {
                continue;
            }
            let path = target.split('#').next().unwrap_or_default();
            let resolved = file.parent().expect("a file's directory").join(path);
            let resolved = resolved
                .canonicalize()
                .unwrap_or_else(|e| panic!("{}: link to {target} does not resolve: {e}", file.display()));
            assert!(resolved.starts_with(&root), "{}: link to {target} leaves the repository", file.display());
            nr_links += 1;
        }
    }
    assert!(nr_links >= 20, "only {nr_links} relative links found: is the link parser broken?");
}
