//! Generates the libfabric bindings from the installed headers (`libfabric-dev`) and compiles the
//! C shim that gives libfabric's `static inline` calls a linkable symbol.
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    println!("cargo:rerun-if-changed=shim/shim.c");
    println!("cargo:rerun-if-changed=shim/shim.h");
    if !std::path::Path::new("/usr/include/rdma/fabric.h").exists() {
        panic!("libfabric headers not found (/usr/include/rdma/fabric.h): install libfabric-dev (scripts/install-deps.sh)");
    }
    let obj = out.join("shim.o");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .args(["-c", "-O2", "-fPIC", "-Wall", "-o"])
        .arg(&obj)
        .arg("shim/shim.c")
        .status()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(st.success(), "compiling shim/shim.c failed");
    let lib = out.join("librucx_ofi_shim.a");
    let _ = std::fs::remove_file(&lib);
    let st = Command::new("ar")
        .arg("crs")
        .arg(&lib)
        .arg(&obj)
        .status()
        .expect("running ar");
    assert!(st.success(), "ar failed");
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=static=rucx_ofi_shim");
    println!("cargo:rustc-link-lib=dylib=fabric");

    let bindings = bindgen::Builder::default()
        .header("shim/shim.h")
        .allowlist_function("rucx_fi_.*|fi_getinfo|fi_freeinfo|fi_dupinfo|fi_fabric|fi_strerror")
        .allowlist_type("fi_.*|fid_.*")
        .allowlist_var("FI_.*")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .derive_default(true)
        .size_t_is_usize(true)
        .layout_tests(false)
        .generate_comments(false)
        .generate()
        .expect("bindgen failed on shim/shim.h");
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("writing bindings.rs");
}
