//! The crates' files form layers: no file imports, directly or through
//! others, a file that imports it (issue 17). And the core's layer map in
//! `docs/design.md` ("Layers of the core") names every file of
//! `crates/core/src` once, and every reference goes to the file's own layer
//! or a lower one.
//!
//! A reference is any `crate::a::b` path (in `use` lines, braced groups
//! included, and in code), `super::x` and `self::x`, outside comments and
//! outside `#[cfg(test)]` modules (a unit test may use a higher layer to
//! drive a lower one). A path that names an item re-exported at the crate
//! root (`crate::Vfs`) counts as a reference to the file that defines it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// A module file: its path from the crate root as segments
/// (`["journal", "format"]`), the crate root itself being `[]`.
type ModPath = Vec<String>;

struct Crate {
    files: BTreeMap<ModPath, PathBuf>,
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The source without comments and string literals' contents.
fn strip(src: &str) -> String {
    let b: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == '/' && b.get(i + 1) == Some(&'/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && b.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == '"' && (i == 0 || b[i - 1] != '\'') {
            // A string literal (raw strings with `#` are rare in this tree and
            // hold no `crate::`).
            out.push('"');
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            out.push('"');
            i += 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The source with every `#[cfg(test)]` / `#[cfg(all(test, ...))]` module
/// body removed.
fn without_test_mods(src: &str) -> String {
    let mut s = src.to_string();
    loop {
        let Some(at) = s.find("#[cfg(test)]").or_else(|| s.find("#[cfg(all(test")) else {
            return s;
        };
        let after = &s[at..];
        // The item the attribute applies to: a `mod x { ... }` or `mod x;`.
        let end = match (after.find('{'), after.find(';')) {
            (Some(o), semi) if semi.is_none_or(|p| o < p) => {
                let mut depth = 0usize;
                let mut end = after.len();
                for (k, ch) in after[o..].char_indices() {
                    match ch {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = o + k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (_, Some(p)) => p + 1,
            _ => after.len(),
        };
        s.replace_range(at..at + end, "");
    }
}

/// Expand `a::{b, c::{d, e}}` starting after a `crate::`/`super::` prefix:
/// returns the paths and how many chars were consumed.
fn expand(src: &[char], mut i: usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    let mut path = prefix;
    loop {
        while i < src.len() && src[i].is_whitespace() {
            i += 1;
        }
        if i < src.len() && src[i] == '{' {
            i += 1;
            loop {
                while i < src.len() && (src[i].is_whitespace() || src[i] == ',') {
                    i += 1;
                }
                if i >= src.len() || src[i] == '}' {
                    return i + 1;
                }
                i = expand(src, i, path.clone(), out);
                // Past `as name`, `*` and anything else up to the next item.
                while i < src.len() && !matches!(src[i], ',' | '}') {
                    i += 1;
                }
            }
        }
        let start = i;
        while i < src.len() && is_ident(src[i]) {
            i += 1;
        }
        if i == start {
            out.push(path);
            return i;
        }
        path.push(src[start..i].iter().collect());
        if src.get(i) == Some(&':') && src.get(i + 1) == Some(&':') {
            i += 2;
        } else {
            out.push(path);
            // Skip `as name`.
            return i;
        }
    }
}

fn load_crate(src_dir: &Path) -> Crate {
    let mut files = BTreeMap::new();
    fn walk(dir: &Path, base: &ModPath, files: &mut BTreeMap<ModPath, PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            if p.is_dir() {
                let mut b = base.clone();
                b.push(name);
                walk(&p, &b, files);
            } else if let Some(stem) = name.strip_suffix(".rs") {
                let mut m = base.clone();
                if stem != "mod" && !(base.is_empty() && (stem == "lib" || stem == "main")) {
                    m.push(stem.to_string());
                }
                if base.is_empty() && stem == "main" && files.contains_key(&m) {
                    continue;
                }
                files.insert(m, p);
            }
        }
    }
    walk(src_dir, &Vec::new(), &mut files);
    // A binary crate's `bin/` helpers are not modules of the library.
    files.retain(|m, _| m.first().map(String::as_str) != Some("bin"));
    Crate { files }
}

/// The deepest module file a path from `from`'s context names.
fn resolve(c: &Crate, roots: &HashMap<String, ModPath>, path: &[String]) -> Option<ModPath> {
    let mut cur: ModPath = Vec::new();
    for seg in path {
        let mut next = cur.clone();
        next.push(seg.clone());
        if c.files.contains_key(&next) {
            cur = next;
        } else {
            break;
        }
    }
    if cur.is_empty() {
        // `crate::Name`: an item re-exported at the root.
        return path.first().and_then(|n| roots.get(n)).cloned();
    }
    Some(cur)
}

/// Items the crate root re-exports: name -> defining module file.
fn root_exports(c: &Crate) -> HashMap<String, ModPath> {
    let mut m = HashMap::new();
    let root = std::fs::read_to_string(&c.files[&Vec::new()]).unwrap();
    let text = strip(&root);
    let chars: Vec<char> = text.chars().collect();
    let mut globs = Vec::new();
    let mut k = 0;
    while let Some(p) = text[k..].find("pub use ") {
        let at = k + p + "pub use ".len();
        let ci = text[..at].chars().count();
        let mut paths = Vec::new();
        expand(&chars, ci, Vec::new(), &mut paths);
        for p in paths {
            let p: Vec<String> = p
                .into_iter()
                .filter(|s| s != "crate" && s != "self")
                .collect();
            if let Some(last) = p.last() {
                if let Some(mp) = resolve(c, &HashMap::new(), &p) {
                    if p.len() == mp.len() {
                        globs.push(mp);
                    } else {
                        m.insert(last.clone(), mp);
                    }
                }
            }
        }
        k = at;
    }
    // `pub use types::*`: every public item of those files.
    for g in globs {
        let src = std::fs::read_to_string(&c.files[&g]).unwrap();
        for line in src.lines() {
            let t = line.trim_start();
            for kw in [
                "pub struct ",
                "pub enum ",
                "pub fn ",
                "pub const ",
                "pub type ",
                "pub trait ",
                "pub static ",
            ] {
                if let Some(rest) = t.strip_prefix(kw) {
                    let name: String = rest.chars().take_while(|&ch| is_ident(ch)).collect();
                    m.entry(name).or_insert_with(|| g.clone());
                }
            }
        }
    }
    m
}

/// file -> files it references.
fn graph(c: &Crate) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let roots = root_exports(c);
    let mut g = BTreeMap::new();
    for (m, path) in &c.files {
        if m.is_empty() {
            continue;
        }
        let raw = std::fs::read_to_string(path).unwrap();
        let text = without_test_mods(&strip(&raw));
        let chars: Vec<char> = text.chars().collect();
        let mut deps = BTreeSet::new();
        for (kw, base) in [
            ("crate::", Vec::new()),
            ("super::", {
                // `super` of `a/b.rs` and of `a/b/mod.rs` (both module a::b) is a.
                let mut p = m.clone();
                p.pop();
                p
            }),
            ("self::", m.clone()),
        ] {
            let mut k = 0;
            while let Some(p) = text[k..].find(kw) {
                let at = k + p;
                k = at + kw.len();
                if at > 0 && is_ident(text[..at].chars().next_back().unwrap()) {
                    continue;
                }
                let ci = text[..k].chars().count();
                let mut paths = Vec::new();
                expand(&chars, ci, base.clone(), &mut paths);
                for p in paths {
                    if let Some(t) = resolve(c, &roots, &p) {
                        if &t != m && !t.is_empty() {
                            deps.insert(t);
                        }
                    }
                }
            }
        }
        g.insert(m.clone(), deps);
    }
    g
}

/// Strongly connected components with more than one file (Tarjan).
fn cycles(g: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<Vec<ModPath>> {
    struct S<'a> {
        g: &'a BTreeMap<ModPath, BTreeSet<ModPath>>,
        idx: HashMap<&'a ModPath, usize>,
        low: HashMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        on: BTreeSet<&'a ModPath>,
        next: usize,
        out: Vec<Vec<ModPath>>,
    }
    fn visit<'a>(s: &mut S<'a>, v: &'a ModPath) {
        s.idx.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on.insert(v);
        if let Some(ws) = s.g.get(v) {
            for w in ws {
                if !s.g.contains_key(w) {
                    continue;
                }
                if !s.idx.contains_key(w) {
                    visit(s, w);
                    let lw = s.low[w];
                    let lv = s.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if s.on.contains(w) {
                    let iw = s.idx[w];
                    let lv = s.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
        }
        if s.low[v] == s.idx[v] {
            let mut comp = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = S {
        g,
        idx: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in g.keys() {
        if !s.idx.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn name(m: &ModPath) -> String {
    m.join("/")
}

#[test]
fn no_crate_has_an_import_cycle() {
    let crates_dir = workspace().join("crates");
    let mut report = Vec::new();
    let mut checked = 0;
    let mut names: Vec<_> = std::fs::read_dir(&crates_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    for dir in names {
        let src = dir.join("src");
        if !src.is_dir() {
            continue;
        }
        let c = load_crate(&src);
        let g = graph(&c);
        checked += g.len();
        for comp in cycles(&g) {
            let set: BTreeSet<_> = comp.iter().cloned().collect();
            let mut edges = Vec::new();
            for a in &comp {
                for b in &g[a] {
                    if set.contains(b) {
                        edges.push(format!("{} -> {}", name(a), name(b)));
                    }
                }
            }
            report.push(format!(
                "{}: cycle among {{{}}}: {}",
                dir.file_name().unwrap().to_string_lossy(),
                comp.iter().map(name).collect::<Vec<_>>().join(", "),
                edges.join("; ")
            ));
        }
    }
    assert!(
        checked > 40,
        "found only {checked} module files: is the workspace layout unchanged?"
    );
    assert!(report.is_empty(), "import cycles:\n{}", report.join("\n"));
}

#[test]
fn the_core_layer_map_in_design_md_holds() {
    let doc = std::fs::read_to_string(workspace().join("docs/design.md")).unwrap();
    let start = doc
        .find("## Layers of the core")
        .expect("docs/design.md has no \"## Layers of the core\" section");
    let sec = &doc[start..];
    let sec = &sec[..sec[3..].find("\n## ").map_or(sec.len(), |e| e + 3)];
    // Rows "| N | `a.rs`, `b.rs` | job |", top layer first.
    let mut layer_of: HashMap<String, u32> = HashMap::new();
    for line in sec.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 4 || !cells[0].is_empty() {
            continue;
        }
        let Ok(n) = cells[1].parse::<u32>() else {
            continue;
        };
        for f in cells[2].split('`').filter(|f| f.ends_with(".rs")) {
            let m = f.trim_end_matches(".rs").to_string();
            assert!(layer_of.insert(m, n).is_none(), "{f} is in the map twice");
        }
    }
    let c = load_crate(&workspace().join("crates/core/src"));
    let g = graph(&c);
    let mut problems = Vec::new();
    for m in c.files.keys().filter(|m| !m.is_empty()) {
        if !layer_of.contains_key(&name(m)) {
            problems.push(format!("{}.rs is not in the map", name(m)));
        }
    }
    for f in layer_of.keys() {
        if !c.files.contains_key(&vec![f.clone()]) {
            problems.push(format!("the map names {f}.rs, which does not exist"));
        }
    }
    for (a, deps) in &g {
        for b in deps {
            if let (Some(la), Some(lb)) = (layer_of.get(&name(a)), layer_of.get(&name(b))) {
                if lb > la {
                    problems.push(format!(
                        "{}.rs (layer {la}) uses {}.rs (layer {lb}, higher)",
                        name(a),
                        name(b)
                    ));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "docs/design.md's layer map:\n{}",
        problems.join("\n")
    );
}
