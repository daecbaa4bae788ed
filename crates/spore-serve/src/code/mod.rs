//! Function code: the zip a user uploads, checked and stored by content hash.
//!
//! The zip is untrusted input. It is read with the `zip` crate. For the
//! `spore-uk` runtime only the entry the handler names is extracted, its size
//! bounded before it is read, and it must be an x86_64 ELF with the spore
//! unikernel note. For the Linux runtimes the zip must hold what the handler
//! needs (`python3`: the handler's module; `provided`: a `bootstrap`), and
//! the whole zip becomes the function's code disk ([`disk`]).
//! Stored code lives in `<state>/code/<sha256>/`: the zip through a
//! temporary directory renamed into place, each handler's unikernel image
//! and the code disk (`code.ext4`) each written atomically, all mode 0600.

pub mod disk;

use std::io::{Cursor, Read};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::fs::write_private;

// The limits of a code package, enforced both when a zip is checked (`check`)
// and when it is unpacked into a code disk (`disk::unpack`).

/// Largest zip accepted (Lambda's direct-upload limit).
pub const MAX_ZIP_BYTES: usize = 50 * 1024 * 1024;
/// Largest unpacked entry (Lambda's unzipped limit).
pub const MAX_UNPACKED_BYTES: u64 = 250 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum CodeError {
    #[error(
        "Could not unzip uploaded file. Please check your file, then try to upload again. ({0})"
    )]
    NotAZip(String),
    #[error("The zip file is larger than {MAX_ZIP_BYTES} bytes")]
    TooLarge,
    #[error("The handler '{0}' is not a file in the zip")]
    NoHandler(String),
    #[error("The handler '{handler}' is not a spore unikernel: {why}")]
    NotUnikernel { handler: String, why: &'static str },
    /// A Linux runtime's handler that the zip cannot serve.
    #[error("{0}")]
    BadHandler(String),
    /// The zip cannot be made a code disk (unsafe names, too big).
    #[error("The zip cannot be unpacked: {0}")]
    Unpack(String),
    #[error("storing the code: {0}")]
    Io(#[from] std::io::Error),
}

impl CodeError {
    /// Whether the user's input is at fault (a 400) rather than the host.
    pub fn is_user_error(&self) -> bool {
        !matches!(self, CodeError::Io(_))
    }

    /// Whether the host's disk had no room for the code.
    pub fn is_disk_full(&self) -> bool {
        matches!(self, CodeError::Io(e) if e.kind() == std::io::ErrorKind::StorageFull
            || e.raw_os_error() == Some(libc::ENOSPC)
            || e.to_string().contains("No space left on device"))
    }
}

/// A zip that was checked, with its hash.
pub struct CheckedCode {
    pub sha256_hex: String,
    /// Base64 of the SHA-256, Lambda's `CodeSha256`.
    pub sha256_b64: String,
    pub size: u64,
    /// `spore-uk`: the handler's file (the unikernel); `None` for Linux
    /// runtimes, whose code disk is made from the whole zip.
    pub image: Option<Vec<u8>>,
}

impl CheckedCode {
    fn of(zip: &[u8], image: Option<Vec<u8>>) -> Self {
        let digest = Sha256::digest(zip);
        use base64::Engine;
        CheckedCode {
            sha256_hex: digest.iter().map(|b| format!("{b:02x}")).collect(),
            sha256_b64: base64::engine::general_purpose::STANDARD.encode(digest),
            size: zip.len() as u64,
            image,
        }
    }
}

/// Whether `runtime` runs from a code disk (a Linux runtime).
fn is_linux(runtime: &str) -> bool {
    crate::runtime::find(runtime).is_some_and(|r| r.linux())
}

/// Checks `zip` for `runtime` and `handler`: a readable zip holding what
/// the handler names (see the module's documentation).
pub fn check(zip: &[u8], runtime: &str, handler: &str) -> Result<CheckedCode, CodeError> {
    if zip.len() > MAX_ZIP_BYTES {
        return Err(CodeError::TooLarge);
    }
    let mut archive =
        zip::ZipArchive::new(Cursor::new(zip)).map_err(|e| CodeError::NotAZip(e.to_string()))?;
    match runtime {
        "python3" => {
            check_python_handler(&archive, handler)?;
            return Ok(CheckedCode::of(zip, None));
        }
        // Lambda runs `bootstrap` whatever the handler says; its executable
        // bit is checked when the function initialises (an init error).
        "provided" => {
            if !has_file(&archive, "bootstrap") {
                return Err(CodeError::BadHandler(
                    "The provided runtime needs an executable file named 'bootstrap' at the root of the zip".into(),
                ));
            }
            return Ok(CheckedCode::of(zip, None));
        }
        _ => {}
    }
    let mut entry = match archive.by_name(handler) {
        Ok(e) if e.is_file() => e,
        _ => return Err(CodeError::NoHandler(handler.into())),
    };
    if entry.size() > MAX_UNPACKED_BYTES {
        return Err(CodeError::NotAZip(format!(
            "'{handler}' unpacks to more than {MAX_UNPACKED_BYTES} bytes"
        )));
    }
    // Only a capacity hint: the size is at most MAX_UNPACKED_BYTES here.
    let mut image = Vec::with_capacity(usize::try_from(entry.size()).unwrap_or(0));
    entry
        .by_ref()
        .take(MAX_UNPACKED_BYTES)
        .read_to_end(&mut image)
        .map_err(|e| CodeError::NotAZip(e.to_string()))?;
    check_unikernel(&image).map_err(|why| CodeError::NotUnikernel {
        handler: handler.into(),
        why,
    })?;
    drop(entry);
    Ok(CheckedCode::of(zip, Some(image)))
}

/// Whether the zip has an entry `name` (a directory's entry ends with `/`,
/// so it never matches a file name).
fn has_file(archive: &zip::ZipArchive<Cursor<&[u8]>>, name: &str) -> bool {
    archive.index_for_name(name).is_some()
}

/// A Python handler `module.function` (the module may be `dir/module` or
/// `package.module`, as Lambda's bootstrap imports it) whose module is
/// `module.py` or a package `module/__init__.py` in the zip.
fn check_python_handler(
    archive: &zip::ZipArchive<Cursor<&[u8]>>,
    handler: &str,
) -> Result<(), CodeError> {
    let bad = |why: String| CodeError::BadHandler(why);
    let Some((module, function)) = handler.rsplit_once('.') else {
        return Err(bad(format!(
            "The handler '{handler}' must be module.function (e.g. lambda_function.lambda_handler)"
        )));
    };
    let parts: Vec<&str> = module.split(['.', '/']).collect();
    let identifier = |s: &str| {
        let mut c = s.chars();
        c.next().is_some_and(|c| c.is_alphabetic() || c == '_')
            && c.all(|c| c.is_alphanumeric() || c == '_')
    };
    if !identifier(function) || !parts.iter().all(|p| identifier(p)) {
        return Err(bad(format!(
            "The handler '{handler}' must be module.function, each a Python identifier"
        )));
    }
    let path = parts.join("/");
    let file = format!("{path}.py");
    let package = format!("{path}/__init__.py");
    if has_file(archive, &file) || has_file(archive, &package) {
        return Ok(());
    }
    Err(bad(format!(
        "The handler '{handler}' names the module '{}', but the zip holds neither {file} nor {package}",
        parts.join(".")
    )))
}

/// An x86_64 ELF64 with a `PT_NOTE` segment holding the spore note.
fn check_unikernel(elf: &[u8]) -> Result<(), &'static str> {
    // Offsets come from the uploaded file: every sum is checked.
    let u16_at = |at: usize| {
        elf.get(at..at.checked_add(2)?)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        elf.get(at..at.checked_add(4)?)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |at: usize| {
        elf.get(at..at.checked_add(8)?).map(|b| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            u64::from_le_bytes(a)
        })
    };
    if elf.get(0..4) != Some(b"\x7fELF") {
        return Err("not an ELF file");
    }
    if elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        return Err("not a little-endian 64-bit ELF");
    }
    if u16_at(18) != Some(62) {
        return Err("not an x86_64 ELF");
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(32), u16_at(54), u16_at(56)) else {
        return Err("truncated ELF header");
    };
    let phoff = usize::try_from(phoff).map_err(|_| "bad program headers")?;
    for i in 0..usize::from(phnum) {
        let ph = i
            .checked_mul(usize::from(phentsize))
            .and_then(|at| phoff.checked_add(at));
        let Some(ph) = ph else {
            return Err("bad program headers");
        };
        if u32_at(ph) != Some(4) {
            continue; // not PT_NOTE
        }
        let (Some(off), Some(size)) = (u64_at(ph + 8), u64_at(ph + 32)) else {
            return Err("bad program headers");
        };
        // A size no usize holds reaches past the end of any file, as a
        // saturated one does.
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        let notes = usize::try_from(off)
            .ok()
            .and_then(|off| elf.get(off..off.saturating_add(size)));
        let Some(notes) = notes else {
            return Err("a note segment lies outside the file");
        };
        if has_spore_note(notes) {
            return Ok(());
        }
    }
    Err("no spore unikernel note (build it with the spore-uk runtime)")
}

fn has_spore_note(mut notes: &[u8]) -> bool {
    let align4 = |n: usize| n.div_ceil(4) * 4;
    while notes.len() >= 12 {
        let word = |at: usize| {
            u32::from_le_bytes([notes[at], notes[at + 1], notes[at + 2], notes[at + 3]])
        };
        let (namesz, descsz, kind) = (word(0) as usize, word(4) as usize, word(8));
        let name_end = 12 + namesz;
        let Some(name) = notes.get(12..name_end) else {
            return false;
        };
        let name = name.strip_suffix(b"\0").unwrap_or(name);
        if name == spore_abi::boot::NOTE_NAME && kind == spore_abi::boot::NOTE_TYPE {
            return true;
        }
        let next = 12 + align4(namesz) + align4(descsz);
        match notes.get(next..) {
            Some(rest) => notes = rest,
            None => return false,
        }
    }
    false
}

/// Where code with this hash is stored.
pub fn dir(state: &Path, sha256_hex: &str) -> PathBuf {
    state.join("code").join(sha256_hex)
}

/// The image a handler names in stored code (one file per handler, since a
/// configuration update may name another file of the same zip).
pub fn image_path(state: &Path, sha256_hex: &str, handler: &str) -> PathBuf {
    let tag: String = Sha256::digest(handler.as_bytes())
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect();
    dir(state, sha256_hex).join(format!("image-{tag}"))
}

/// The code disk of stored code (Linux runtimes).
pub fn disk_path(state: &Path, sha256_hex: &str) -> PathBuf {
    dir(state, sha256_hex).join("code.ext4")
}

/// Stores checked code (the zip, and the handler's image or the code disk;
/// files 0600) unless already stored, through a temporary directory renamed
/// into place.
/// On a failure (a full disk) nothing of it is left behind: not the
/// temporary directory, not a code directory this call made.
pub fn store(state: &Path, zip: &[u8], code: &CheckedCode, handler: &str) -> Result<(), CodeError> {
    let final_dir = dir(state, &code.sha256_hex);
    let mut made = false;
    if !final_dir.join("code.zip").exists() {
        let tmp =
            state
                .join("code")
                .join(format!(".tmp-{}-{}", code.sha256_hex, std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let staged = std::fs::create_dir_all(&tmp)
            .and_then(|()| write_private(&tmp.join("code.zip"), zip))
            .and_then(|()| std::fs::rename(&tmp, &final_dir));
        match staged {
            Ok(()) => made = true,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                // Another request may have stored the same code first.
                if !final_dir.join("code.zip").exists() {
                    return Err(e.into());
                }
            }
        }
    }
    let stored = match &code.image {
        Some(image) => store_image(state, &code.sha256_hex, handler, image),
        None => store_disk(state, &code.sha256_hex, zip),
    };
    if stored.is_err() && made {
        let _ = std::fs::remove_dir_all(&final_dir);
    }
    stored
}

/// Builds the code disk of stored code (atomically, 0600), if missing.
fn store_disk(state: &Path, sha256_hex: &str, zip: &[u8]) -> Result<(), CodeError> {
    let path = disk_path(state, sha256_hex);
    if path.exists() {
        return Ok(());
    }
    disk::build(zip, &path).map_err(|e| match e {
        disk::CodeDiskError::Io(e) => CodeError::Io(e),
        e if e.is_user_error() => CodeError::Unpack(e.to_string()),
        e => CodeError::Io(std::io::Error::other(e.to_string())),
    })?;
    Ok(())
}

/// Writes a handler's image into stored code (atomically), if missing.
pub fn store_image(
    state: &Path,
    sha256_hex: &str,
    handler: &str,
    image: &[u8],
) -> Result<(), CodeError> {
    let path = image_path(state, sha256_hex, handler);
    if path.exists() {
        return Ok(());
    }
    write_private(&path, image)?;
    Ok(())
}

/// Checks stored code again for another runtime or handler (a
/// configuration update) and stores that handler's image or the code disk.
pub fn rehandle(
    state: &Path,
    sha256_hex: &str,
    runtime: &str,
    handler: &str,
) -> Result<(), CodeError> {
    let zip = std::fs::read(dir(state, sha256_hex).join("code.zip"))?;
    let code = check(&zip, runtime, handler)?;
    match &code.image {
        Some(image) => store_image(state, sha256_hex, handler, image),
        None if is_linux(runtime) => store_disk(state, sha256_hex, &zip),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn zip_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
        for (name, data) in entries {
            w.start_file(*name, zip::write::SimpleFileOptions::default())
                .unwrap();
            w.write_all(data).unwrap();
        }
        w.finish().unwrap().into_inner()
    }

    /// A minimal ELF64 x86_64 with one PT_NOTE segment holding `note`.
    fn elf_with_note(name: &[u8], kind: u32) -> Vec<u8> {
        let mut elf = vec![0u8; 64 + 56];
        elf[0..4].copy_from_slice(b"\x7fELF");
        elf[4] = 2;
        elf[5] = 1;
        elf[18..20].copy_from_slice(&62u16.to_le_bytes());
        elf[32..40].copy_from_slice(&64u64.to_le_bytes());
        elf[54..56].copy_from_slice(&56u16.to_le_bytes());
        elf[56..58].copy_from_slice(&1u16.to_le_bytes());
        let mut note = Vec::new();
        let namesz = u32::try_from(name.len() + 1).expect("a test's note name is short");
        note.extend_from_slice(&namesz.to_le_bytes());
        note.extend_from_slice(&4u32.to_le_bytes());
        note.extend_from_slice(&kind.to_le_bytes());
        note.extend_from_slice(name);
        note.push(0);
        while note.len() % 4 != 0 {
            note.push(0);
        }
        note.extend_from_slice(&1u32.to_le_bytes());
        let ph = 64;
        elf[ph..ph + 4].copy_from_slice(&4u32.to_le_bytes());
        elf[ph + 8..ph + 16].copy_from_slice(&(120u64).to_le_bytes());
        elf[ph + 32..ph + 40].copy_from_slice(&(note.len() as u64).to_le_bytes());
        elf.extend_from_slice(&note);
        elf
    }

    #[test]
    fn accepts_a_unikernel_and_refuses_the_rest() {
        let good = elf_with_note(b"spore", spore_abi::boot::NOTE_TYPE);
        let code = check(&zip_of(&[("fn", &good)]), "spore-uk", "fn").unwrap();
        assert_eq!(code.image, Some(good.clone()));
        assert_eq!(code.sha256_hex.len(), 64);

        assert!(matches!(
            check(b"not a zip", "spore-uk", "fn"),
            Err(CodeError::NotAZip(_))
        ));
        assert!(matches!(
            check(&zip_of(&[("other", &good)]), "spore-uk", "fn"),
            Err(CodeError::NoHandler(_))
        ));
        assert!(matches!(
            check(&zip_of(&[("fn", b"#!/bin/sh\n")]), "spore-uk", "fn"),
            Err(CodeError::NotUnikernel { .. })
        ));
        let other_note = elf_with_note(b"GNU", 3);
        assert!(matches!(
            check(&zip_of(&[("fn", &other_note)]), "spore-uk", "fn"),
            Err(CodeError::NotUnikernel { .. })
        ));
        let mut truncated = good.clone();
        truncated.truncate(100);
        assert!(matches!(
            check(&zip_of(&[("fn", &truncated)]), "spore-uk", "fn"),
            Err(CodeError::NotUnikernel { .. })
        ));
        // Offsets at the top of the address space are refused, not overflowed.
        let mut far_headers = good.clone();
        far_headers[32..40].copy_from_slice(&(u64::MAX - 1).to_le_bytes());
        let mut far_note = good.clone();
        far_note[64 + 8..64 + 16].copy_from_slice(&u64::MAX.to_le_bytes());
        far_note[64 + 32..64 + 40].copy_from_slice(&u64::MAX.to_le_bytes());
        for elf in [far_headers, far_note] {
            assert!(matches!(
                check(&zip_of(&[("fn", &elf)]), "spore-uk", "fn"),
                Err(CodeError::NotUnikernel { .. })
            ));
        }
    }

    #[test]
    fn python_handlers_need_their_module() {
        let zip = zip_of(&[
            ("app.py", b"def handler(e, c): return e\n"),
            ("pkg/__init__.py", b""),
            ("pkg/mod.py", b""),
            ("lib/__init__.py", b""),
        ]);
        for ok in ["app.handler", "pkg.mod.handler", "pkg/mod.handler", "lib.f"] {
            let code = check(&zip, "python3", ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
            assert!(code.image.is_none());
        }
        let refused = |h: &str| match check(&zip, "python3", h) {
            Err(CodeError::BadHandler(m)) => m,
            other => panic!("{h}: expected a refusal, got {:?}", other.map(|_| ())),
        };
        assert!(refused("handler").contains("must be module.function"));
        assert!(refused("app.").contains("Python identifier"));
        assert!(refused("../x.h").contains("Python identifier"));
        assert_eq!(
            refused("missing.handler"),
            "The handler 'missing.handler' names the module 'missing', but the zip holds neither missing.py nor missing/__init__.py"
        );
        assert!(refused("pkg.other.h").contains("pkg/other.py"));
    }

    #[test]
    fn provided_needs_a_bootstrap() {
        assert!(check(&zip_of(&[("bootstrap", b"#!/bin/sh\n")]), "provided", "x").is_ok());
        assert!(matches!(
            check(&zip_of(&[("bin/bootstrap", b"")]), "provided", "x"),
            Err(CodeError::BadHandler(_))
        ));
        assert!(matches!(
            check(b"not a zip", "provided", "x"),
            Err(CodeError::NotAZip(_))
        ));
    }
}
