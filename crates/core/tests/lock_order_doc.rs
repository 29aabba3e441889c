//! The lock-order table of `docs/design.md` section 2 is a copy of
//! `scalevfs_sync::ordered::Class`: same rows, in the same order, with the
//! same level, name and same-class rule. Fails when either is edited alone.

use scalevfs_sync::ordered::{Class, Nest};

fn nest_word(n: Nest) -> &'static str {
    match n {
        Nest::No => "no",
        Nest::Ascending => "ascending",
        Nest::UnderRenameMutex => "two, under rename_mutex",
        Nest::TryOnly => "try-lock only",
    }
}

/// (level, name, same-class rule) of each numbered row of section 2's table.
fn doc_rows(doc: &str) -> Vec<(u8, String, String)> {
    let start = doc
        .find("## 2. LOCKING RULES")
        .expect("design.md has no section 2, LOCKING RULES");
    let sec = &doc[start..];
    let sec = &sec[..sec[3..].find("\n## ").map_or(sec.len(), |e| e + 3)];
    let mut rows = Vec::new();
    for line in sec.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // "| # | lock | same class | ..." splits into ["", "#", ...].
        if cells.len() < 5 || !cells[0].is_empty() {
            continue;
        }
        let Ok(level) = cells[1].parse::<u8>() else {
            continue;
        };
        let name = cells[2].trim_matches('`').to_string();
        rows.push((level, name, cells[3].to_string()));
    }
    rows
}

#[test]
fn design_doc_table_matches_the_code() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/design.md");
    let doc = std::fs::read_to_string(path).expect("read docs/design.md");
    let rows = doc_rows(&doc);
    let code: Vec<(u8, String, String)> = Class::ALL
        .iter()
        .map(|c| (c.level(), c.name().to_string(), nest_word(c.nest()).into()))
        .collect();
    for (i, (d, c)) in rows.iter().zip(&code).enumerate() {
        assert_eq!(
            d,
            c,
            "row {} of the design.md table differs from Class::ALL",
            i + 1
        );
    }
    assert_eq!(
        rows.len(),
        code.len(),
        "design.md lists {} locks, Class::ALL {}",
        rows.len(),
        code.len()
    );
}

#[test]
fn parser_sees_a_changed_row() {
    let doc = "## 2. LOCKING RULES\n\n| # | lock | same class |\n|---|---|---|\n\
               | 1 | `A` | no | x |\n| 2 | `B` | ascending | y |\n\n## 3. next\n| 9 | `C` | no | z |\n";
    assert_eq!(
        doc_rows(doc),
        vec![
            (1, "A".to_string(), "no".to_string()),
            (2, "B".to_string(), "ascending".to_string())
        ]
    );
}
