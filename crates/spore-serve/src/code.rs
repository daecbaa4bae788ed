//! Function code: the zip a user uploads, checked and stored by content hash.
//!
//! The zip is untrusted input. It is read with the `zip` crate, only the
//! entry the handler names is extracted, and its size is bounded before it is
//! read; for the `spore-uk` runtime that entry must be an x86_64 ELF with the
//! spore unikernel note. Stored code lives in `<state>/code/<sha256>/`,
//! written through a temporary directory and renamed into place.

use std::io::{Cursor, Read};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

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
    #[error("storing the code: {0}")]
    Io(#[from] std::io::Error),
}

impl CodeError {
    /// Whether the user's input is at fault (a 400) rather than the host.
    pub fn is_user_error(&self) -> bool {
        !matches!(self, CodeError::Io(_))
    }
}

/// A zip that was checked, with its hash.
pub struct CheckedCode {
    pub sha256_hex: String,
    /// Base64 of the SHA-256, Lambda's `CodeSha256`.
    pub sha256_b64: String,
    pub size: u64,
    /// The handler's file.
    pub image: Vec<u8>,
}

/// Checks `zip` for `runtime` and `handler`: a readable zip holding the
/// handler's file, which for `spore-uk` is a spore unikernel.
pub fn check(zip: &[u8], handler: &str) -> Result<CheckedCode, CodeError> {
    if zip.len() > MAX_ZIP_BYTES {
        return Err(CodeError::TooLarge);
    }
    let mut archive =
        zip::ZipArchive::new(Cursor::new(zip)).map_err(|e| CodeError::NotAZip(e.to_string()))?;
    let mut entry = match archive.by_name(handler) {
        Ok(e) if e.is_file() => e,
        _ => return Err(CodeError::NoHandler(handler.into())),
    };
    if entry.size() > MAX_UNPACKED_BYTES {
        return Err(CodeError::NotAZip(format!(
            "'{handler}' unpacks to more than {MAX_UNPACKED_BYTES} bytes"
        )));
    }
    let mut image = Vec::with_capacity(entry.size() as usize);
    entry
        .by_ref()
        .take(MAX_UNPACKED_BYTES)
        .read_to_end(&mut image)
        .map_err(|e| CodeError::NotAZip(e.to_string()))?;
    check_unikernel(&image).map_err(|why| CodeError::NotUnikernel {
        handler: handler.into(),
        why,
    })?;
    let digest = Sha256::digest(zip);
    use base64::Engine;
    Ok(CheckedCode {
        sha256_hex: digest.iter().map(|b| format!("{b:02x}")).collect(),
        sha256_b64: base64::engine::general_purpose::STANDARD.encode(digest),
        size: zip.len() as u64,
        image,
    })
}

/// An x86_64 ELF64 with a `PT_NOTE` segment holding the spore note.
fn check_unikernel(elf: &[u8]) -> Result<(), &'static str> {
    let u16_at = |at: usize| {
        elf.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        elf.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |at: usize| {
        elf.get(at..at + 8).map(|b| {
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
    for i in 0..phnum as usize {
        let Some(ph) = (phoff as usize).checked_add(i * phentsize as usize) else {
            return Err("bad program headers");
        };
        if u32_at(ph) != Some(4) {
            continue; // not PT_NOTE
        }
        let (Some(off), Some(size)) = (u64_at(ph + 8), u64_at(ph + 32)) else {
            return Err("bad program headers");
        };
        let Some(notes) = elf.get(off as usize..(off as usize).saturating_add(size as usize))
        else {
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

/// Stores checked code (the zip, and the handler's image; files 0600) unless
/// already stored, through a temporary directory renamed into place.
pub fn store(state: &Path, zip: &[u8], code: &CheckedCode, handler: &str) -> Result<(), CodeError> {
    let final_dir = dir(state, &code.sha256_hex);
    if !final_dir.join("code.zip").exists() {
        let tmp =
            state
                .join("code")
                .join(format!(".tmp-{}-{}", code.sha256_hex, std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp)?;
        write_private(&tmp.join("code.zip"), zip)?;
        sync_dir(&tmp)?;
        if let Err(e) = std::fs::rename(&tmp, &final_dir) {
            let _ = std::fs::remove_dir_all(&tmp);
            // Another request may have stored the same code first.
            if !final_dir.join("code.zip").exists() {
                return Err(e.into());
            }
        }
    }
    store_image(state, &code.sha256_hex, handler, &code.image)
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
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    write_private(&tmp, image)?;
    std::fs::rename(&tmp, &path)?;
    Ok(())
}

/// Checks stored code again for another handler (a configuration update)
/// and stores that handler's image.
pub fn rehandle(state: &Path, sha256_hex: &str, handler: &str) -> Result<(), CodeError> {
    let zip = std::fs::read(dir(state, sha256_hex).join("code.zip"))?;
    let code = check(&zip, handler)?;
    store_image(state, sha256_hex, handler, &code.image)
}

fn sync_dir(path: &Path) -> std::io::Result<()> {
    std::fs::File::open(path)?.sync_all()
}

fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(data)?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

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
        note.extend_from_slice(&(name.len() as u32 + 1).to_le_bytes());
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
        let code = check(&zip_of(&[("fn", &good)]), "fn").unwrap();
        assert_eq!(code.image, good);
        assert_eq!(code.sha256_hex.len(), 64);

        assert!(matches!(
            check(b"not a zip", "fn"),
            Err(CodeError::NotAZip(_))
        ));
        assert!(matches!(
            check(&zip_of(&[("other", &good)]), "fn"),
            Err(CodeError::NoHandler(_))
        ));
        assert!(matches!(
            check(&zip_of(&[("fn", b"#!/bin/sh\n")]), "fn"),
            Err(CodeError::NotUnikernel { .. })
        ));
        let other_note = elf_with_note(b"GNU", 3);
        assert!(matches!(
            check(&zip_of(&[("fn", &other_note)]), "fn"),
            Err(CodeError::NotUnikernel { .. })
        ));
        let mut truncated = good.clone();
        truncated.truncate(100);
        assert!(matches!(
            check(&zip_of(&[("fn", &truncated)]), "fn"),
            Err(CodeError::NotUnikernel { .. })
        ));
    }
}
