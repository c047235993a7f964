//! Plugin (shared library) discovery and loading (UCX `ucs/sys/module.c`).
//!
//! Plugins are searched in `RUCX_MODULE_DIR` (colon list), then the running executable's
//! directory and its `rucx/` subfolder; [`find`] matches `<prefix><name><suffix>` (first hit per
//! name wins) and [`allowed`] applies the `RUCX_MODULES` allow/deny list. [`open`] loads a
//! library with `RTLD_NOW | RTLD_LOCAL` (so missing symbols fail at load time) and never
//! unloads it: symbols taken from it stay valid for the life of the process.
#![allow(unsafe_code)]

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use libloading::Library;

use crate::config::{AllowList, Overrides, GLOBAL_TABLE};
use crate::Status;

/// Directories searched for plugins, in order: `RUCX_MODULE_DIR` entries, the executable's
/// directory, its `rucx/` subfolder. Missing directories and duplicates are dropped.
pub fn search_dirs() -> Vec<PathBuf> {
    search_dirs_with(&Overrides::new())
}

/// [`search_dirs`] with `MODULE_DIR` possibly set in code.
pub fn search_dirs_with(code: &Overrides) -> Vec<PathBuf> {
    let mut candidates: Vec<PathBuf> = GLOBAL_TABLE
        .with(code)
        .get_list("MODULE_DIR")
        .unwrap_or_default()
        .into_iter()
        .map(PathBuf::from)
        .collect();
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        let sub = dir.join("rucx");
        candidates.push(dir);
        candidates.push(sub);
    }
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for dir in candidates {
        let Ok(canon) = dir.canonicalize() else { continue };
        if canon.is_dir() && !seen.contains(&canon) {
            seen.push(canon);
            out.push(dir);
        }
    }
    out
}

/// Plugins named `<prefix><name><suffix>` in [`search_dirs`], as `(name, path)`.
pub fn find(prefix: &str, suffix: &str) -> Vec<(String, PathBuf)> {
    find_in(&search_dirs(), prefix, suffix)
}

/// Like [`find`] over the given directories: files in each directory in name order; a name
/// found in an earlier directory hides later ones. Unreadable directories are skipped.
pub fn find_in(dirs: &[PathBuf], prefix: &str, suffix: &str) -> Vec<(String, PathBuf)> {
    let mut found: Vec<(String, PathBuf)> = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            crate::debug!(dir = %dir.display(), "cannot read plugin directory");
            continue;
        };
        let mut files: Vec<(String, PathBuf)> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let file = e.file_name().into_string().ok()?;
                let name = file.strip_prefix(prefix)?.strip_suffix(suffix)?;
                let path = e.path();
                (!name.is_empty() && path.is_file()).then(|| (name.to_string(), path))
            })
            .collect();
        files.sort();
        for (name, path) in files {
            if !found.iter().any(|(n, _)| *n == name) {
                found.push((name, path));
            }
        }
    }
    found
}

/// True if `RUCX_MODULES` allows plugin `name` (an invalid value is logged and ignored).
pub fn allowed(name: &str) -> bool {
    allowed_with(name, &Overrides::new())
}

/// [`allowed`] with `MODULES` possibly set in code.
pub fn allowed_with(name: &str, code: &Overrides) -> bool {
    GLOBAL_TABLE
        .with(code)
        .get_allow_list("MODULES")
        .unwrap_or(AllowList {
            deny: true,
            items: Vec::new(),
        })
        .allows(name)
}

/// Why a plugin could not be loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModuleError {
    /// No file at that path.
    NotFound {
        /// The file looked for.
        path: PathBuf,
    },
    /// The file is unreadable or not a loadable shared library for this machine.
    NotSharedLibrary {
        /// The plugin file.
        path: PathBuf,
        /// The dynamic loader's message.
        detail: String,
    },
    /// A library it depends on is missing, e.g. `libibverbs.so.1`.
    MissingDependency {
        /// The plugin file.
        path: PathBuf,
        /// The library that is missing.
        dependency: String,
        /// The dynamic loader's message.
        detail: String,
    },
    /// It needs a symbol that no loaded library provides (version mismatch).
    UndefinedSymbol {
        /// The plugin file.
        path: PathBuf,
        /// The dynamic loader's message (it names the symbol).
        detail: String,
    },
    /// Any other loader error.
    Other {
        /// The plugin file.
        path: PathBuf,
        /// The dynamic loader's message.
        detail: String,
    },
}

impl fmt::Display for ModuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModuleError::NotFound { path } => write!(f, "plugin {} does not exist", path.display()),
            ModuleError::NotSharedLibrary { path, detail } => write!(
                f,
                "{} is not a loadable shared library ({detail}); remove it from the plugin \
                 directory or rebuild it for this machine",
                path.display()
            ),
            ModuleError::MissingDependency {
                path,
                dependency,
                detail,
            } => write!(
                f,
                "plugin {} needs {dependency}, which is not installed ({detail}); install it \
                 or exclude the plugin with RUCX_MODULES=^<name>",
                path.display()
            ),
            ModuleError::UndefinedSymbol { path, detail } => write!(
                f,
                "plugin {} does not match the installed libraries ({detail}); rebuild it",
                path.display()
            ),
            ModuleError::Other { path, detail } => {
                write!(f, "cannot load plugin {}: {detail}", path.display())
            }
        }
    }
}

impl std::error::Error for ModuleError {}

impl From<ModuleError> for Status {
    fn from(e: ModuleError) -> Status {
        match e {
            ModuleError::NotFound { .. } => Status::NoElem,
            _ => Status::IoError,
        }
    }
}

/// Maps a `dlerror()` message to a [`ModuleError`].
pub fn classify_dlerror(path: &Path, message: &str) -> ModuleError {
    let path = path.to_path_buf();
    let detail = message.to_string();
    let (who, what) = message.split_once(": ").unwrap_or(("", message));
    let is_self = who == path.to_string_lossy() || who.is_empty();
    if what.starts_with("cannot open shared object file") {
        if is_self {
            return ModuleError::NotSharedLibrary { path, detail };
        }
        return ModuleError::MissingDependency {
            path,
            dependency: who.to_string(),
            detail,
        };
    }
    const NOT_ELF: &[&str] = &[
        "invalid ELF header",
        "file too short",
        "wrong ELF class",
        "ELF file",
        "not a dynamic",
        "only ET_DYN and ET_EXEC",
        "cannot dynamically load",
        "cannot read file data",
    ];
    if NOT_ELF.iter().any(|m| what.contains(m)) {
        return ModuleError::NotSharedLibrary { path, detail };
    }
    if what.contains("undefined symbol") || what.contains("version `") {
        return ModuleError::UndefinedSymbol { path, detail };
    }
    ModuleError::Other { path, detail }
}

/// Libraries opened so far, by the path they were opened with; never unloaded.
static OPENED: Mutex<Vec<(PathBuf, &'static Library)>> = Mutex::new(Vec::new());

/// Loads a shared library (a path, or a bare file name searched by the system loader). Loading
/// the same path again returns the same library. The library is never unloaded.
pub fn open(path: &Path) -> Result<&'static Library, ModuleError> {
    let key = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let mut opened = OPENED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, lib)) = opened.iter().find(|(p, _)| *p == key) {
        return Ok(lib);
    }
    let is_bare_name = path.components().count() == 1 && !path.to_string_lossy().contains('/');
    if !is_bare_name && !path.exists() {
        return Err(ModuleError::NotFound {
            path: path.to_path_buf(),
        });
    }
    use libloading::os::unix::{Library as UnixLibrary, RTLD_LOCAL, RTLD_NOW};
    // SAFETY: loading runs the library's initializers. Only libraries from the configured plugin
    // directories (or system libraries named by rucx itself) are loaded; they are trusted code,
    // like any dynamically linked dependency.
    let lib = unsafe { UnixLibrary::open(Some(path), RTLD_NOW | RTLD_LOCAL) };
    match lib {
        Ok(lib) => {
            let lib: &'static Library = Box::leak(Box::new(Library::from(lib)));
            opened.push((key, lib));
            crate::debug!(path = %path.display(), "loaded plugin");
            Ok(lib)
        }
        Err(e) => {
            // For DlOpen errors, Display is exactly the dlerror() text.
            Err(classify_dlerror(path, &e.to_string()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rucx-module-test-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn find_first_hit_wins_and_filters_names() {
        let a = temp_dir("a");
        let b = temp_dir("b");
        for f in [
            "libuct_tcp.so",
            "libuct_ib.so",
            "libuct_.so",
            "libucp_x.so",
            "libuct_ib.so.0",
        ] {
            std::fs::write(a.join(f), b"x").unwrap();
        }
        std::fs::create_dir(a.join("libuct_dir.so")).unwrap();
        std::fs::write(b.join("libuct_ib.so"), b"x").unwrap();
        std::fs::write(b.join("libuct_self.so"), b"x").unwrap();
        let missing = a.join("nope");
        let found = find_in(&[a.clone(), missing, b.clone()], "libuct_", ".so");
        let names: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, vec!["ib", "tcp", "self"]);
        assert_eq!(found[0].1, a.join("libuct_ib.so"), "first directory wins");
        assert_eq!(found[2].1, b.join("libuct_self.so"));
        std::fs::remove_dir_all(&a).unwrap();
        std::fs::remove_dir_all(&b).unwrap();
    }

    #[test]
    fn search_dirs_env_first_deduped() {
        let d = temp_dir("dirs");
        let spec = format!("{0}:/nonexistent/rucx-xyz:{0}", d.display());
        std::env::set_var("RUCX_MODULE_DIR", &spec);
        let dirs = search_dirs();
        std::env::remove_var("RUCX_MODULE_DIR");
        assert_eq!(dirs[0], d);
        assert_eq!(dirs.iter().filter(|p| **p == d).count(), 1);
        assert!(dirs.iter().all(|p| p.is_dir()));
        let exe_dir = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
        assert!(dirs.contains(&exe_dir));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn allow_list_filtering() {
        std::env::set_var("RUCX_MODULES", "^ib,rdma*");
        let (ib, tcp, rdmacm) = (allowed("ib"), allowed("tcp"), allowed("rdmacm"));
        std::env::remove_var("RUCX_MODULES");
        assert!(!ib && tcp && !rdmacm);
        assert!(allowed("ib"), "default is all");
    }

    #[test]
    fn open_errors_are_clear() {
        let d = temp_dir("open");
        let fake = d.join("libuct_fake.so");
        std::fs::write(
            &fake,
            b"this is not an ELF file, just text........................",
        )
        .unwrap();
        let err = open(&fake).unwrap_err();
        assert!(matches!(err, ModuleError::NotSharedLibrary { .. }), "{err:?}");
        assert!(err.to_string().contains("not a loadable shared library"), "{err}");
        let err = open(&d.join("libuct_missing.so")).unwrap_err();
        assert!(matches!(err, ModuleError::NotFound { .. }));
        assert_eq!(Status::from(err), Status::NoElem);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn open_system_library_once() {
        let a = open(Path::new("libc.so.6")).expect("libc must load");
        let b = open(Path::new("libc.so.6")).unwrap();
        assert!(std::ptr::eq(a, b));
        // SAFETY: `getpid` has this signature in every libc.
        let getpid = unsafe { a.get::<unsafe extern "C" fn() -> i32>(b"getpid\0") }.unwrap();
        // SAFETY: getpid has no preconditions.
        assert_eq!(unsafe { getpid() } as u32, std::process::id());
    }

    #[test]
    fn classify_messages() {
        let p = Path::new("/opt/rucx/libuct_ib.so");
        let e = classify_dlerror(
            p,
            "libibverbs.so.1: cannot open shared object file: No such file or directory",
        );
        assert_eq!(
            e,
            ModuleError::MissingDependency {
                path: p.into(),
                dependency: "libibverbs.so.1".into(),
                detail: "libibverbs.so.1: cannot open shared object file: No such file or directory".into()
            }
        );
        assert!(e.to_string().contains("needs libibverbs.so.1"));
        let e = classify_dlerror(p, "/opt/rucx/libuct_ib.so: invalid ELF header");
        assert!(matches!(e, ModuleError::NotSharedLibrary { .. }));
        let e = classify_dlerror(
            p,
            "/opt/rucx/libuct_ib.so: cannot open shared object file: Permission denied",
        );
        assert!(matches!(e, ModuleError::NotSharedLibrary { .. }));
        let e = classify_dlerror(p, "/opt/rucx/libuct_ib.so: undefined symbol: ibv_foo");
        assert!(matches!(e, ModuleError::UndefinedSymbol { .. }));
        let e = classify_dlerror(p, "something odd");
        assert!(matches!(e, ModuleError::Other { .. }));
    }
}
