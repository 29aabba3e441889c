//! Model-based property test: random sequences of namespace operations on
//! scalevfs give the same results (values and errnos) as a small reference
//! model of Linux's namespace semantics, written here from the kernel's
//! rules (namei.c's walk, do_renameat2's lock_rename "trap" checks,
//! may_delete's EISDIR/ENOTDIR, simple_rename's ENOTEMPTY).
//!
//! The name space is small on purpose (three names, two levels, absolute
//! symlinks among them) so sequences collide: renames over existing names,
//! directories moved under themselves, loops, dangling links.

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;
use scalevfs::*;

// ---------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Kind {
    File,
    Dir(BTreeMap<String, usize>),
    Symlink(String),
}

#[derive(Clone, Debug)]
struct Node {
    kind: Kind,
    nlink: u32,
}

#[derive(Clone, Debug)]
struct Model {
    nodes: HashMap<usize, Node>,
    next: usize,
}

type R<T> = Result<T, Errno>;

fn comps(path: &str) -> Vec<String> {
    path.split('/')
        .filter(|c| !c.is_empty())
        .map(str::to_string)
        .collect()
}

impl Model {
    fn new() -> Model {
        let mut nodes = HashMap::new();
        nodes.insert(
            0,
            Node {
                kind: Kind::Dir(BTreeMap::new()),
                nlink: 2,
            },
        );
        Model { nodes, next: 1 }
    }

    fn children(&self, id: usize) -> Option<&BTreeMap<String, usize>> {
        match &self.nodes[&id].kind {
            Kind::Dir(c) => Some(c),
            _ => None,
        }
    }
    fn children_mut(&mut self, id: usize) -> &mut BTreeMap<String, usize> {
        match &mut self.nodes.get_mut(&id).unwrap().kind {
            Kind::Dir(c) => c,
            _ => panic!("not a dir"),
        }
    }
    fn is_dir(&self, id: usize) -> bool {
        matches!(self.nodes[&id].kind, Kind::Dir(_))
    }

    /// Walk `cs` from `start` (namei): intermediate symlinks are followed,
    /// the last one only with `follow`; 40 links at most.
    fn walk(&self, start: usize, cs: &[String], follow: bool, links: &mut u32) -> R<usize> {
        let mut cur = start;
        for (i, c) in cs.iter().enumerate() {
            let Some(ch) = self.children(cur) else {
                return Err(Errno::ENOTDIR);
            };
            let child = *ch.get(c).ok_or(Errno::ENOENT)?;
            let last = i + 1 == cs.len();
            match &self.nodes[&child].kind {
                Kind::Symlink(t) if !last || follow => {
                    *links += 1;
                    if *links > 40 {
                        return Err(Errno::ELOOP);
                    }
                    cur = self.walk(0, &comps(t), true, links)?;
                }
                _ => cur = child,
            }
        }
        Ok(cur)
    }

    fn resolve(&self, path: &str, follow: bool) -> R<usize> {
        self.walk(0, &comps(path), follow, &mut 0)
    }

    /// The parent directory and the last name.
    fn parent(&self, path: &str) -> R<(usize, String)> {
        let cs = comps(path);
        let (last, dir) = cs.split_last().unwrap();
        let p = self.walk(0, dir, true, &mut 0)?;
        if !self.is_dir(p) {
            return Err(Errno::ENOTDIR);
        }
        Ok((p, last.clone()))
    }

    fn lookup(&self, dir: usize, name: &str) -> Option<usize> {
        self.children(dir).unwrap().get(name).copied()
    }

    fn add(&mut self, kind: Kind) -> usize {
        let id = self.next;
        self.next += 1;
        let nlink = if matches!(kind, Kind::Dir(_)) { 2 } else { 1 };
        self.nodes.insert(id, Node { kind, nlink });
        id
    }

    fn create(&mut self, path: &str, kind: Kind) -> R<()> {
        let (p, name) = self.parent(path)?;
        if self.lookup(p, &name).is_some() {
            return Err(Errno::EEXIST);
        }
        let is_dir = matches!(kind, Kind::Dir(_));
        let id = self.add(kind);
        self.children_mut(p).insert(name, id);
        if is_dir {
            self.nodes.get_mut(&p).unwrap().nlink += 1;
        }
        Ok(())
    }

    fn link(&mut self, old: &str, new: &str) -> R<()> {
        let src = self.resolve(old, false)?;
        let (p, name) = self.parent(new)?;
        if self.lookup(p, &name).is_some() {
            return Err(Errno::EEXIST);
        }
        if self.is_dir(src) {
            return Err(Errno::EPERM);
        }
        self.children_mut(p).insert(name, src);
        self.nodes.get_mut(&src).unwrap().nlink += 1;
        Ok(())
    }

    /// One name of a non-directory goes; the inode goes with its last name.
    fn drop_link(&mut self, id: usize) {
        let n = self.nodes.get_mut(&id).unwrap();
        n.nlink -= 1;
        if n.nlink == 0 {
            self.nodes.remove(&id);
        }
    }

    fn unlink(&mut self, path: &str, rmdir: bool) -> R<()> {
        let (p, name) = self.parent(path)?;
        let v = self.lookup(p, &name).ok_or(Errno::ENOENT)?;
        if rmdir {
            let Some(ch) = self.children(v) else {
                return Err(Errno::ENOTDIR);
            };
            if !ch.is_empty() {
                return Err(Errno::ENOTEMPTY);
            }
            self.children_mut(p).remove(&name);
            self.nodes.get_mut(&p).unwrap().nlink -= 1;
            self.nodes.remove(&v);
        } else {
            if self.is_dir(v) {
                return Err(Errno::EISDIR);
            }
            self.children_mut(p).remove(&name);
            self.drop_link(v);
        }
        Ok(())
    }

    /// Whether `a` is `d` or an ancestor of `d` (directories only).
    fn is_ancestor(&self, a: usize, d: usize) -> bool {
        // Parents are found by search: the model is small.
        let mut cur = d;
        loop {
            if cur == a {
                return true;
            }
            if cur == 0 {
                return false;
            }
            cur = self.parent_of_dir(cur);
        }
    }
    fn parent_of_dir(&self, d: usize) -> usize {
        for (id, n) in &self.nodes {
            if let Kind::Dir(c) = &n.kind {
                if c.values().any(|&x| x == d) {
                    return *id;
                }
            }
        }
        panic!("orphan directory {d}");
    }

    fn rename(&mut self, old: &str, new: &str, flags: u32) -> R<()> {
        if flags & RENAME_NOREPLACE != 0 && flags & RENAME_EXCHANGE != 0 {
            return Err(Errno::EINVAL);
        }
        let exchange = flags & RENAME_EXCHANGE != 0;
        let (op, oname) = self.parent(old)?;
        let (np, nname) = self.parent(new)?;
        let src = self.lookup(op, &oname).ok_or(Errno::ENOENT)?;
        let dst = self.lookup(np, &nname);
        if flags & RENAME_NOREPLACE != 0 && dst.is_some() {
            return Err(Errno::EEXIST);
        }
        if exchange && dst.is_none() {
            return Err(Errno::ENOENT);
        }
        // lock_rename's trap: the entry of one parent that leads to the other.
        if op != np {
            if self.is_dir(src) && self.is_ancestor(src, np) {
                return Err(Errno::EINVAL);
            }
            if let Some(d) = dst {
                if self.is_dir(d) && self.is_ancestor(d, op) {
                    return Err(if exchange {
                        Errno::EINVAL
                    } else {
                        Errno::ENOTEMPTY
                    });
                }
            }
        }
        if dst == Some(src) {
            return Ok(());
        }
        if let Some(d) = dst {
            if !exchange {
                match (self.is_dir(src), self.is_dir(d)) {
                    (true, false) => return Err(Errno::ENOTDIR),
                    (false, true) => return Err(Errno::EISDIR),
                    (true, true) if !self.children(d).unwrap().is_empty() => {
                        return Err(Errno::ENOTEMPTY)
                    }
                    _ => {}
                }
            }
        }
        let sdir = self.is_dir(src);
        if exchange {
            let d = dst.unwrap();
            let ddir = self.is_dir(d);
            self.children_mut(op).insert(oname, d);
            self.children_mut(np).insert(nname, src);
            if sdir != ddir {
                let (gain, lose) = if sdir { (np, op) } else { (op, np) };
                self.nodes.get_mut(&gain).unwrap().nlink += 1;
                self.nodes.get_mut(&lose).unwrap().nlink -= 1;
            }
            return Ok(());
        }
        self.children_mut(op).remove(&oname);
        if let Some(d) = dst {
            if self.is_dir(d) {
                self.nodes.remove(&d);
                self.nodes.get_mut(&np).unwrap().nlink -= 1;
            } else {
                self.drop_link(d);
            }
        }
        self.children_mut(np).insert(nname, src);
        if sdir {
            self.nodes.get_mut(&op).unwrap().nlink -= 1;
            self.nodes.get_mut(&np).unwrap().nlink += 1;
        }
        Ok(())
    }

    fn stat(&self, path: &str, follow: bool) -> R<(usize, u32, u32)> {
        let id = self.resolve(path, follow)?;
        let n = &self.nodes[&id];
        let ty = match n.kind {
            Kind::File => S_IFREG,
            Kind::Dir(_) => S_IFDIR,
            Kind::Symlink(_) => S_IFLNK,
        };
        Ok((id, ty, n.nlink))
    }

    fn readdir(&self, path: &str) -> R<Vec<(String, u32)>> {
        let id = self.resolve(path, true)?;
        let ch = self.children(id).ok_or(Errno::ENOTDIR)?;
        Ok(ch
            .iter()
            .map(|(k, v)| {
                let t = match self.nodes[v].kind {
                    Kind::File => S_IFREG,
                    Kind::Dir(_) => S_IFDIR,
                    Kind::Symlink(_) => S_IFLNK,
                };
                (k.clone(), t)
            })
            .collect())
    }
}

// ---------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Op {
    Mkdir(String),
    Create(String),
    Unlink(String),
    Rmdir(String),
    Rename(String, String, u32),
    Link(String, String),
    Symlink(String, String),
    Stat(String, bool),
    Readdir(String),
    /// Evict every unused dentry (no effect on the model: the cache must
    /// never change an answer).
    Shrink,
}

fn path() -> impl Strategy<Value = String> {
    let name = prop::sample::select(vec!["a", "b", "c"]);
    prop::collection::vec(name, 1..=3).prop_map(|v| v.join("/"))
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => path().prop_map(Op::Mkdir),
        3 => path().prop_map(Op::Create),
        2 => path().prop_map(Op::Unlink),
        2 => path().prop_map(Op::Rmdir),
        4 => (path(), path(), prop::sample::select(vec![0, 0, RENAME_NOREPLACE, RENAME_EXCHANGE]))
            .prop_map(|(a, b, f)| Op::Rename(a, b, f)),
        1 => (path(), path()).prop_map(|(a, b)| Op::Link(a, b)),
        1 => (path(), path()).prop_map(|(t, l)| Op::Symlink(format!("/{t}"), l)),
        3 => (path(), any::<bool>()).prop_map(|(p, f)| Op::Stat(p, f)),
        1 => prop_oneof![Just(String::from("/")), path()].prop_map(Op::Readdir),
        1 => Just(Op::Shrink),
    ]
}

/// Map of model inode id -> scalevfs ino, checked to stay a bijection.
#[derive(Default)]
struct Ids {
    m2s: HashMap<usize, u64>,
    s2m: HashMap<u64, usize>,
}

impl Ids {
    fn check(&mut self, model: usize, ino: u64) -> Result<(), TestCaseError> {
        let a = *self.m2s.entry(model).or_insert(ino);
        let b = *self.s2m.entry(ino).or_insert(model);
        prop_assert_eq!(a, ino, "model inode {} seen as two scalevfs inodes", model);
        prop_assert_eq!(b, model, "scalevfs inode {} is two model inodes", ino);
        Ok(())
    }
}

fn run(ops: &[Op], cfg: VfsConfig) -> Result<(), TestCaseError> {
    let vfs = Vfs::with_config(cfg);
    let t = vfs.root_task();
    let mut m = Model::new();
    let mut ids = Ids::default();
    ids.check(0, t.stat("/").unwrap().ino)?;
    for (i, o) in ops.iter().enumerate() {
        match o {
            Op::Stat(p, follow) => {
                let got = if *follow {
                    t.stat(p.as_str())
                } else {
                    t.lstat(p.as_str())
                };
                let want = m.stat(p, *follow);
                match (got, want) {
                    (Ok(s), Ok((id, ty, nlink))) => {
                        prop_assert_eq!(s.mode & S_IFMT, ty, "op {} {:?}", i, o);
                        prop_assert_eq!(s.nlink, nlink, "op {} {:?}", i, o);
                        ids.check(id, s.ino)?;
                    }
                    (g, w) => prop_assert_eq!(g.map(|_| ()), w.map(|_| ()), "op {} {:?}", i, o),
                }
            }
            Op::Shrink => {
                vfs.flush_deferred();
                while vfs.dcache().shrink(usize::MAX, false) > 0 {}
            }
            Op::Readdir(p) => {
                let got = t.read_dir(p.as_str()).map(|v| {
                    v.into_iter()
                        .filter(|e| e.name != b"." && e.name != b"..")
                        .map(|e| (String::from_utf8(e.name).unwrap(), e.file_type.mode_bits()))
                        .collect::<Vec<_>>()
                });
                let got = got.map(|mut v| {
                    v.sort();
                    v
                });
                prop_assert_eq!(got, m.readdir(p), "op {} {:?}", i, o);
            }
            _ => {
                let got = match o {
                    Op::Mkdir(p) => t.mkdir(p.as_str(), 0o755),
                    Op::Create(p) => t.mknodat(AT_FDCWD, p.as_str(), S_IFREG | 0o644, 0),
                    Op::Unlink(p) => t.unlink(p.as_str()),
                    Op::Rmdir(p) => t.rmdir(p.as_str()),
                    Op::Rename(a, b, f) => {
                        t.renameat2(AT_FDCWD, a.as_str(), AT_FDCWD, b.as_str(), *f)
                    }
                    Op::Link(a, b) => t.link(a.as_str(), b.as_str()),
                    Op::Symlink(tg, l) => t.symlink(tg.as_str(), l.as_str()),
                    _ => unreachable!(),
                };
                let want = match o {
                    Op::Mkdir(p) => m.create(p, Kind::Dir(BTreeMap::new())),
                    Op::Create(p) => m.create(p, Kind::File),
                    Op::Unlink(p) => m.unlink(p, false),
                    Op::Rmdir(p) => m.unlink(p, true),
                    Op::Rename(a, b, f) => m.rename(a, b, *f),
                    Op::Link(a, b) => m.link(a, b),
                    Op::Symlink(tg, l) => m.create(l, Kind::Symlink(tg.clone())),
                    _ => unreachable!(),
                };
                prop_assert_eq!(got, want, "op {} {:?}", i, o);
            }
        }
    }
    // Final state: the whole tree, with inode identities and link counts.
    fn compare(
        t: &Task,
        m: &Model,
        ids: &mut Ids,
        dir: usize,
        path: &str,
    ) -> Result<(), TestCaseError> {
        for (name, &id) in m.children(dir).unwrap() {
            let p = format!("{path}/{name}");
            let s = t
                .lstat(p.as_str())
                .map_err(|e| TestCaseError::fail(format!("{p}: {e:?}")))?;
            ids.check(id, s.ino)?;
            prop_assert_eq!(s.nlink, m.nodes[&id].nlink, "nlink of {}", p);
            if m.is_dir(id) {
                compare(t, m, ids, id, &p)?;
            }
        }
        let names = t
            .read_dir(if path.is_empty() { "/" } else { path })
            .unwrap()
            .len();
        prop_assert_eq!(
            names,
            m.children(dir).unwrap().len() + 2,
            "entries of {}",
            path
        );
        Ok(())
    }
    compare(&t, &m, &mut ids, 0, "")?;
    prop_assert_eq!(t.stat("/").unwrap().nlink, m.nodes[&0].nlink);
    Ok(())
}

fn config(authoritative: bool, per_dir: bool, walk_ref: bool) -> VfsConfig {
    let mut c = VfsConfig::default();
    c.dcache.hash_bits = 6;
    c.dcache.max_entries = 64;
    c.memfs.authoritative = authoritative;
    if per_dir {
        c.dcache.index = DcacheIndex::PerDir;
    }
    VfsConfig {
        walk: if walk_ref {
            WalkMode::RefOnly
        } else {
            WalkMode::LockFree
        },
        ..c
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, max_shrink_iters: 2000, ..ProptestConfig::default() })]

    #[test]
    fn scalevfs_matches_model(
        ops in prop::collection::vec(op(), 1..60),
        auth in any::<bool>(),
        per_dir in any::<bool>(),
        walk_ref in prop::bool::weighted(0.2),
    ) {
        run(&ops, config(auth, per_dir, walk_ref))?;
    }
}

/// Sequences that once disagreed, kept as plain regression cases.
#[test]
fn model_regressions() {
    let seqs: Vec<Vec<Op>> = vec![
        vec![
            Op::Mkdir("a".into()),
            Op::Mkdir("a/b".into()),
            Op::Rename("a".into(), "a/b/c".into(), 0),
            Op::Rename("a/b".into(), "a".into(), 0),
            Op::Rename("a/b".into(), "a".into(), RENAME_EXCHANGE),
            Op::Symlink("/a/b".into(), "c".into()),
            Op::Rename("a".into(), "c/x".into(), 0),
            Op::Symlink("/c".into(), "b".into()),
            Op::Symlink("/b".into(), "c/b/x".into()),
            Op::Stat("b/b".into(), true),
        ],
        vec![
            Op::Create("a".into()),
            Op::Link("a".into(), "b".into()),
            Op::Rename("a".into(), "b".into(), 0),
            Op::Rename("a".into(), "b".into(), RENAME_NOREPLACE),
            Op::Rename("a".into(), "b".into(), RENAME_EXCHANGE),
            Op::Unlink("a".into()),
            Op::Stat("b".into(), false),
        ],
    ];
    for s in seqs {
        for (auth, per_dir) in [(true, false), (false, true)] {
            run(&s, config(auth, per_dir, false)).unwrap();
        }
    }
}
