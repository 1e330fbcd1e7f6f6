//! Where a function starts in a library file, for a uprobe: the file offset of a symbol,
//! chosen with its version in mind.
//!
//! aya's own resolver takes the first symbol of a name and ignores versions. libibverbs
//! exports two copies of 34 functions (`ibv_modify_qp@IBVERBS_1.0`, the compatibility shim,
//! and `ibv_modify_qp@@IBVERBS_1.1`, the one every current program calls), so a probe placed by
//! name alone can sit on the copy nobody calls and never fire. Here exported functions are
//! taken at their default (`@@`) version, and NCCL's internal functions, which are C++ and
//! local, are found in `.symtab` by their mangled name's prefix (`_Z11ncclIbIsend…`), whatever
//! their parameter list in a given build.
//!
//! Files are read through a read cache: only the headers, symbol tables and strings are
//! touched, never the 470 MB of a CUDA library.

use std::fs::File;
use std::path::Path;

use object::elf::{FileHeader64, PT_LOAD, SHN_UNDEF, SHT_DYNSYM, SHT_SYMTAB, STT_FUNC};
use object::read::elf::{FileHeader, ProgramHeader, Sym};
use object::{Endianness, ReadCache, SymbolIndex};

/// A function found in a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// Its full symbol name (mangled for C++).
    pub symbol: String,
    /// The version it was taken at (`IBVERBS_1.1`), if the file versions its symbols.
    pub version: Option<String>,
    /// The symbol's virtual address and the file offset a uprobe attaches at.
    pub address: u64,
    pub offset: u64,
}

/// A library's function symbols, read once.
#[derive(Debug)]
pub struct Symbols {
    /// (name, version, is the default version, address), from `.dynsym` then `.symtab`.
    entries: Vec<Entry>,
    /// The loadable segments: (virtual address, file offset, size in file).
    segments: Vec<(u64, u64, u64)>,
}

#[derive(Debug)]
struct Entry {
    name: String,
    version: Option<String>,
    default: bool,
    address: u64,
    exported: bool,
}

/// Why a file's symbols could not be read.
#[derive(Debug)]
pub struct Unreadable(pub String);

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unreadable {}

impl Symbols {
    /// Reads the function symbols of the 64-bit ELF file at `path`.
    pub fn read(path: &Path) -> Result<Symbols, Unreadable> {
        let why = |e: &dyn std::fmt::Display| Unreadable(format!("{}: {e}", path.display()));
        let file = File::open(path).map_err(|e| why(&e))?;
        let cache = ReadCache::new(file);
        let data = &cache;
        let header = FileHeader64::<Endianness>::parse(data).map_err(|e| why(&e))?;
        let endian = header.endian().map_err(|e| why(&e))?;
        let sections = header.sections(endian, data).map_err(|e| why(&e))?;
        let mut segments = Vec::new();
        for ph in header.program_headers(endian, data).map_err(|e| why(&e))? {
            if ph.p_type(endian) == PT_LOAD {
                segments.push((ph.p_vaddr(endian), ph.p_offset(endian), ph.p_filesz(endian)));
            }
        }
        let versions = sections.versions(endian, data).map_err(|e| why(&e))?;
        let mut entries = Vec::new();
        for (sh_type, exported) in [(SHT_DYNSYM, true), (SHT_SYMTAB, false)] {
            let table = sections
                .symbols(endian, data, sh_type)
                .map_err(|e| why(&e))?;
            let strings = table.strings();
            for (i, sym) in table.iter().enumerate() {
                if sym.st_type() != STT_FUNC || sym.st_shndx(endian) == SHN_UNDEF {
                    continue;
                }
                let Ok(name) = sym.name(endian, strings) else {
                    continue;
                };
                let (mut version, mut default) = (None, true);
                if let (true, Some(v)) = (exported, versions.as_ref()) {
                    let index = v.version_index(endian, SymbolIndex(i));
                    default = !index.is_hidden();
                    if let Ok(Some(ver)) = v.version(index) {
                        version = Some(String::from_utf8_lossy(ver.name()).into_owned());
                    }
                }
                entries.push(Entry {
                    name: String::from_utf8_lossy(name).into_owned(),
                    version,
                    default,
                    address: sym.st_value(endian),
                    exported,
                });
            }
        }
        Ok(Symbols { entries, segments })
    }

    /// An exported function at its default version: `name@@VERSION`, or the only copy of an
    /// unversioned name. `None` when the file does not export it.
    pub fn exported(&self, name: &str) -> Option<Found> {
        let e = self
            .entries
            .iter()
            .find(|e| e.exported && e.default && e.name == name)?;
        self.found(e)
    }

    /// A function by its name as written in the source: a C symbol of exactly that name, or a
    /// C++ one whose mangled name starts `_Z<len><name>` (any parameter list), from either
    /// table. When several addresses carry it (local copies in two translation units), the
    /// first of the lowest address is taken and `ambiguous` says so.
    pub fn function(&self, name: &str) -> Option<(Found, bool)> {
        let mangled = format!("_Z{}{name}", name.len());
        let mut matches: Vec<&Entry> = self
            .entries
            .iter()
            .filter(|e| {
                e.name == name
                    || (e.name.starts_with(&mangled)
                        && !e.name[mangled.len()..].starts_with(|c: char| c.is_ascii_digit()))
            })
            .filter(|e| !e.name.contains('.'))
            .collect();
        matches.sort_by_key(|e| e.address);
        let first = matches.first()?;
        let ambiguous = matches.iter().any(|e| e.address != first.address);
        Some((self.found(first)?, ambiguous))
    }

    fn found(&self, e: &Entry) -> Option<Found> {
        let offset = self
            .segments
            .iter()
            .find(|(vaddr, _, size)| e.address >= *vaddr && e.address < vaddr + size)
            .map(|(vaddr, off, _)| e.address - vaddr + off)?;
        Some(Found {
            symbol: e.name.clone(),
            version: e.version.clone(),
            address: e.address,
            offset,
        })
    }
}

/// The index of the first `void **` parameter in a mangled C++ function name whose parameters
/// are all `void *`, `int`, integers, or pointers to those (`_Z13ncclIbConnectPviS_PS_PP…`):
/// where a connect or accept function writes its new comm. `None` when the list holds
/// anything else before it.
pub fn first_out_pointer(mangled: &str, name: &str) -> Option<u32> {
    let mut rest = mangled.strip_prefix(&format!("_Z{}{name}", name.len()))?;
    // Itanium substitutions: `S_` is the first substitutable type seen (`Pv`), `S0_` the
    // second. Only the forms NCCL's net plugins use are understood.
    let mut subs: Vec<&'static str> = Vec::new();
    let mut index = 0u32;
    while !rest.is_empty() {
        let (ty, len): (&'static str, usize) = if rest.starts_with("PPv") {
            ("PPv", 3)
        } else if rest.starts_with("Pv") {
            ("Pv", 2)
        } else if rest.starts_with("PS_") && subs.first() == Some(&"Pv") {
            ("PPv", 3)
        } else if rest.starts_with("S_") {
            (*subs.first()?, 2)
        } else if rest.starts_with("S0_") {
            (*subs.get(1)?, 3)
        } else if rest.starts_with("Pi") {
            ("Pi", 2)
        } else if rest.starts_with("Pm") {
            ("Pm", 2)
        } else if rest.starts_with(['i', 'j', 'l', 'm', 's', 'c']) {
            ("", 1)
        } else {
            return None;
        };
        if ty == "PPv" {
            return Some(index);
        }
        if !ty.is_empty() && !subs.contains(&ty) {
            subs.push(ty);
        }
        rest = &rest[len..];
        index += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_out_pointer_of_ncclsconnect_and_accept_is_found_in_their_mangled_names() {
        // NCCL 2.32.3's `ncclIbConnect(void*, int, void*, void**, ncclNetDeviceHandle_v7_t**)`.
        assert_eq!(
            first_out_pointer(
                "_Z13ncclIbConnectPviS_PS_PP24ncclNetDeviceHandle_v7_t",
                "ncclIbConnect"
            ),
            Some(3)
        );
        // `ncclIbAccept(void*, void**, ncclNetDeviceHandle_v7_t**)`.
        assert_eq!(
            first_out_pointer(
                "_Z12ncclIbAcceptPvPS_PP24ncclNetDeviceHandle_v7_t",
                "ncclIbAccept"
            ),
            Some(1)
        );
        // An older `ncclIbConnect(int, void*, void**, …)`.
        assert_eq!(
            first_out_pointer(
                "_Z13ncclIbConnectiPvPS_PP24ncclNetDeviceHandle_v7_t",
                "ncclIbConnect"
            ),
            Some(2)
        );
        // A parameter list it does not understand before the out pointer.
        assert_eq!(
            first_out_pointer("_Z13ncclIbConnectP7ncclFooPPv", "ncclIbConnect"),
            None
        );
    }
}
