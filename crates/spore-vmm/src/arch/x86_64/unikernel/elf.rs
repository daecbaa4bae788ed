//! ELF64 parsing for unikernel images: header, program headers and the spore
//! note. The image is untrusted input: every offset and size is checked
//! against the file length and the limits below before anything is read.

use std::io::{Read, Seek, SeekFrom};

use linux_loader::elf::{Elf64_Ehdr, Elf64_Nhdr, Elf64_Phdr, EM_X86_64, PT_LOAD, PT_NOTE};
use spore_abi::boot::{NOTE_NAME, NOTE_TYPE};
use vm_memory::ByteValued;

use super::UnikernelError;
use crate::host_usize;

/// More program headers than any static unikernel needs; bounds the work
/// and the allocation a hostile header can cause.
pub const MAX_PHNUM: usize = 64;
/// Largest PT_NOTE segment scanned for the spore note.
pub const MAX_NOTE_SEGMENT: u64 = 64 * 1024;

const EI_CLASS: usize = 4;
const EI_DATA: usize = 5;
const ELFCLASS64: u8 = 2;
const ELFDATA2LSB: u8 = 1;
/// Executable segment flag.
pub const PF_X: u32 = 1;

/// The parts of an ELF image the loader needs.
#[derive(Debug)]
pub struct ElfImage {
    pub e_type: u16,
    pub entry: u64,
    pub phdrs: Vec<Elf64_Phdr>,
}

impl ElfImage {
    /// PT_LOAD segments that occupy memory.
    pub fn loads(&self) -> impl Iterator<Item = &Elf64_Phdr> {
        self.phdrs
            .iter()
            .filter(|p| p.p_type == PT_LOAD && p.p_memsz > 0)
    }
}

/// Reads the ELF header; `Ok(None)` if the file is not an ELF at all (so a
/// caller can try other formats), an error if it is an ELF this loader cannot
/// boot.
pub fn read_header(image: &mut (impl Read + Seek)) -> Result<Option<Elf64_Ehdr>, UnikernelError> {
    image.seek(SeekFrom::Start(0))?;
    let mut ehdr = Elf64_Ehdr::default();
    let mut read = 0;
    let buf = ehdr.as_mut_slice();
    while read < buf.len() {
        match image.read(&mut buf[read..])? {
            0 => return Ok(None),
            n => read += n,
        }
    }
    if &ehdr.e_ident[..4] != b"\x7fELF" {
        return Ok(None);
    }
    if ehdr.e_ident[EI_CLASS] != ELFCLASS64
        || ehdr.e_ident[EI_DATA] != ELFDATA2LSB
        || ehdr.e_machine != EM_X86_64
    {
        return Err(UnikernelError::NotX86_64Elf);
    }
    Ok(Some(ehdr))
}

/// Parses header and program headers, with bounds checks; `Ok(None)` if the
/// file is not an ELF.
pub fn parse(image: &mut (impl Read + Seek)) -> Result<Option<ElfImage>, UnikernelError> {
    let Some(ehdr) = read_header(image)? else {
        return Ok(None);
    };
    let file_len = image.seek(SeekFrom::End(0))?;
    let phnum = usize::from(ehdr.e_phnum);
    if phnum == 0 || phnum > MAX_PHNUM {
        return Err(UnikernelError::BadElf(format!(
            "{phnum} program headers (1 to {MAX_PHNUM} allowed)"
        )));
    }
    let phsize = std::mem::size_of::<Elf64_Phdr>();
    if usize::from(ehdr.e_phentsize) != phsize {
        return Err(UnikernelError::BadElf(format!(
            "program header size {} is not {phsize}",
            ehdr.e_phentsize
        )));
    }
    ehdr.e_phoff
        .checked_add((phnum * phsize) as u64)
        .filter(|&end| end <= file_len)
        .ok_or_else(|| {
            UnikernelError::BadElf("program headers lie past the end of the file".into())
        })?;
    image.seek(SeekFrom::Start(ehdr.e_phoff))?;
    let mut phdrs = Vec::with_capacity(phnum);
    for _ in 0..phnum {
        let mut phdr = Elf64_Phdr::default();
        image.read_exact(phdr.as_mut_slice())?;
        let file_end = phdr.p_offset.checked_add(phdr.p_filesz);
        if file_end.is_none_or(|end| end > file_len) {
            return Err(UnikernelError::BadElf(format!(
                "segment at file offset {:#x} (+{:#x}) lies past the end of the file",
                phdr.p_offset, phdr.p_filesz
            )));
        }
        phdrs.push(phdr);
    }
    Ok(Some(ElfImage {
        e_type: ehdr.e_type,
        entry: ehdr.e_entry,
        phdrs,
    }))
}

/// The protocol version in the image's spore note, None if it has none.
pub fn spore_note_version(
    image: &mut (impl Read + Seek),
    elf: &ElfImage,
) -> Result<Option<u32>, UnikernelError> {
    for phdr in elf.phdrs.iter().filter(|p| p.p_type == PT_NOTE) {
        if phdr.p_filesz > MAX_NOTE_SEGMENT {
            return Err(UnikernelError::BadElf(format!(
                "note segment of {:#x} bytes exceeds {MAX_NOTE_SEGMENT:#x}",
                phdr.p_filesz
            )));
        }
        let mut buf = vec![0u8; host_usize::from_u64(phdr.p_filesz)];
        image.seek(SeekFrom::Start(phdr.p_offset))?;
        image.read_exact(&mut buf)?;
        if let Some(v) = find_spore_note(&buf) {
            return Ok(Some(v));
        }
    }
    Ok(None)
}

/// Walks the notes of one PT_NOTE segment. Malformed notes end the walk (they
/// cannot be the spore note) rather than fail: the spore note is what matters.
pub fn find_spore_note(mut notes: &[u8]) -> Option<u32> {
    let nhdr_size = std::mem::size_of::<Elf64_Nhdr>();
    let align4 = |n: usize| n.checked_add(3).map(|n| n & !3);
    // The buffer may sit at any alignment, so the header words are read as bytes.
    let word = |b: &[u8], i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    while notes.len() >= nhdr_size {
        let namesz = word(notes, 0) as usize;
        let descsz = word(notes, 4) as usize;
        let n_type = word(notes, 8);
        let name_start = nhdr_size;
        let desc_start = name_start.checked_add(align4(namesz)?)?;
        let next = desc_start.checked_add(align4(descsz)?)?;
        let name = notes.get(name_start..name_start + namesz)?;
        let desc = notes.get(desc_start..desc_start + descsz)?;
        // The name is NUL-terminated in the note.
        let name = name.strip_suffix(&[0]).unwrap_or(name);
        if name == NOTE_NAME && n_type == NOTE_TYPE && descsz >= 4 {
            return Some(u32::from_le_bytes([desc[0], desc[1], desc[2], desc[3]]));
        }
        notes = notes.get(next..).unwrap_or(&[]);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(name: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&(u32::try_from(name.len()).unwrap() + 1).to_le_bytes());
        v.extend_from_slice(&u32::try_from(desc.len()).unwrap().to_le_bytes());
        v.extend_from_slice(&kind.to_le_bytes());
        v.extend_from_slice(name);
        v.push(0);
        while v.len() % 4 != 0 {
            v.push(0);
        }
        v.extend_from_slice(desc);
        while v.len() % 4 != 0 {
            v.push(0);
        }
        v
    }

    #[test]
    fn finds_note_among_others() {
        let mut seg = note(b"GNU", 3, &[1, 2, 3, 4, 5, 6, 7, 8]);
        seg.extend(note(b"spore", NOTE_TYPE, &7u32.to_le_bytes()));
        assert_eq!(find_spore_note(&seg), Some(7));
        assert_eq!(find_spore_note(&note(b"spore", 1, &[1, 0, 0, 0])), None);
        assert_eq!(
            find_spore_note(&note(b"spor", NOTE_TYPE, &[1, 0, 0, 0])),
            None
        );
        assert_eq!(find_spore_note(&note(b"spore", NOTE_TYPE, &[1, 0])), None);
    }

    #[test]
    fn malformed_notes_do_not_panic() {
        assert_eq!(find_spore_note(&[]), None);
        assert_eq!(find_spore_note(&[0xff; 12]), None);
        let mut huge = note(b"spore", NOTE_TYPE, &[1, 0, 0, 0]);
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(find_spore_note(&huge), None);
    }
}
