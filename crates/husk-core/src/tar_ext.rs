//! Tar extension headers (GNU long names and links, PAX records) read with bounds.
//!
//! The tar crate, left to itself, reads each extension entry whole into memory whatever size
//! its header claims: a 285 KiB gzip of a 900 MB PAX header made the server allocate 892 MB.
//! Every unpacker of hostile archives (workspace imports, build contexts, image layers) reads
//! its entries raw (`Entries::raw(true)`) and hands each one to [`Extensions::absorb`], which
//! keeps what an extension entry says for the entry after it, within [`MAX_NAME_BYTES`] and
//! [`MAX_PAX_BYTES`], and refuses anything larger before reading it.

use std::borrow::Cow;
use std::io::{self, Read};

use tar::{Entry, EntryType};

/// Largest GNU long name or long link (PATH_MAX, its NUL included).
pub const MAX_NAME_BYTES: u64 = 4096;
/// Largest PAX extended header.
pub const MAX_PAX_BYTES: u64 = 64 << 10;

/// Why an extension header was not taken.
#[derive(Debug, thiserror::Error)]
pub enum ExtError {
    /// The archive could not be read (truncated, broken, or the reader's own bound hit).
    #[error("cannot read the archive: {0}")]
    Read(#[source] io::Error),
    /// The header is refused (too large, repeated, or dangling at the end).
    #[error("{0}")]
    Refused(String),
}

/// What the extension entries before an entry said about it.
#[derive(Debug, Default)]
pub struct Extensions {
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
    pax: Option<Vec<u8>>,
    /// A global PAX header since the last entry: read (at most one per entry, so that every
    /// entry costs a bounded number of bytes) and never used (its records, comments and
    /// charsets, hold nothing husk keeps).
    global: Option<Vec<u8>>,
}

impl Extensions {
    /// Takes `entry` in if it is an extension entry and says whether it was one. A real
    /// entry is left unread, for the caller, who then takes these extensions with
    /// `std::mem::take`.
    pub fn absorb<R: Read>(&mut self, entry: &mut Entry<'_, R>) -> Result<bool, ExtError> {
        let ty = entry.header().entry_type();
        let (slot, max, what) = match ty {
            EntryType::GNULongName => (&mut self.long_name, MAX_NAME_BYTES, "long name"),
            EntryType::GNULongLink => (&mut self.long_link, MAX_NAME_BYTES, "long link"),
            EntryType::XHeader => (&mut self.pax, MAX_PAX_BYTES, "PAX header"),
            EntryType::XGlobalHeader => (&mut self.global, MAX_PAX_BYTES, "global PAX header"),
            _ => return Ok(false),
        };
        if slot.is_some() {
            return Err(ExtError::Refused(format!("two {what}s for one entry")));
        }
        let size = entry.header().entry_size().unwrap_or(u64::MAX);
        if size > max {
            return Err(ExtError::Refused(format!(
                "{what} larger than {max} bytes ({size} bytes)"
            )));
        }
        let mut data = Vec::with_capacity(size as usize);
        entry
            .take(max)
            .read_to_end(&mut data)
            .map_err(ExtError::Read)?;
        if matches!(ty, EntryType::GNULongName | EntryType::GNULongLink) {
            // GNU names end with a NUL (and are sometimes padded with more).
            while data.last() == Some(&0) {
                data.pop();
            }
        }
        *slot = Some(data);
        Ok(true)
    }

    /// Whether no extension entry is waiting for its entry.
    pub fn is_empty(&self) -> bool {
        self.long_name.is_none() && self.long_link.is_none() && self.pax.is_none()
    }

    /// At the end of the archive: extension entries with no entry after them are an error.
    pub fn finish(&self) -> Result<(), ExtError> {
        if self.is_empty() {
            Ok(())
        } else {
            Err(ExtError::Refused(
                "an extension header without an entry after it".into(),
            ))
        }
    }

    /// The entry's path: PAX `path`, else the GNU long name, else the header's.
    pub fn path<'a, R: Read>(&'a self, entry: &'a Entry<'_, R>) -> Cow<'a, [u8]> {
        if let Some(p) = self.record(b"path") {
            return Cow::Borrowed(p);
        }
        match &self.long_name {
            Some(n) => Cow::Borrowed(n),
            None => entry.header().path_bytes(),
        }
    }

    /// The entry's link target: PAX `linkpath`, else the GNU long link, else the header's.
    pub fn link<'a, R: Read>(&'a self, entry: &'a Entry<'_, R>) -> Option<Cow<'a, [u8]>> {
        if let Some(p) = self.record(b"linkpath") {
            return Some(Cow::Borrowed(p));
        }
        match &self.long_link {
            Some(n) => Some(Cow::Borrowed(n)),
            None => entry.header().link_name_bytes(),
        }
    }

    /// The PAX records, in order (empty without a PAX header); a malformed one is an error.
    pub fn records(&self) -> impl Iterator<Item = Result<(&[u8], &[u8]), ExtError>> {
        tar::PaxExtensions::new(self.pax.as_deref().unwrap_or_default()).map(|r| {
            r.map(|r| (r.key_bytes(), r.value_bytes()))
                .map_err(|_| ExtError::Refused("malformed PAX header".into()))
        })
    }

    /// The value of the last well-formed PAX record `key` (the last one wins, as in tar).
    fn record(&self, key: &[u8]) -> Option<&[u8]> {
        self.records()
            .filter_map(Result::ok)
            .filter(|(k, _)| *k == key)
            .last()
            .map(|(_, v)| v)
    }
}

/// A PAX number (`mtime` may have a fraction, which is dropped); `None` if it is not one.
pub fn pax_number(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value)
        .ok()?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// Hostile archives for the tests of husk's unpackers (in this and other crates). Not an API.
#[doc(hidden)]
pub mod fixtures {
    use std::io::Write;

    /// A gzip'd archive of one PAX header claiming, and holding, `bytes` of zeros: a few
    /// hundred KiB as sent for 64 MiB.
    pub fn huge_pax_header_gzip(bytes: u64) -> Vec<u8> {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::XHeader);
        h.set_path("PaxHeaders/bomb").expect("a short path");
        h.set_size(bytes);
        h.set_cksum();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(h.as_bytes()).expect("writes to memory");
        let zeros = vec![0u8; 1 << 20];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(zeros.len() as u64);
            gz.write_all(&zeros[..n as usize])
                .expect("writes to memory");
            left -= n;
        }
        gz.finish().expect("writes to memory")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An archive of one extension entry of type `ty` holding `data`, then a file `f`.
    fn archive(ty: EntryType, data: &[u8]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(ty);
        h.set_size(data.len() as u64);
        h.set_path("././@LongLink").unwrap();
        h.set_cksum();
        b.append(&h, data).unwrap();
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(EntryType::Regular);
        h.set_size(1);
        h.set_path("f").unwrap();
        h.set_link_name("short").unwrap();
        h.set_cksum();
        b.append(&h, &b"x"[..]).unwrap();
        b.into_inner().unwrap()
    }

    /// What `absorb` makes of the archive: the path and link of its one real entry.
    fn read(data: &[u8]) -> Result<(Vec<u8>, Option<Vec<u8>>), ExtError> {
        let mut a = tar::Archive::new(data);
        let mut ext = Extensions::default();
        let mut out = None;
        for e in a.entries().map_err(ExtError::Read)?.raw(true) {
            let mut e = e.map_err(ExtError::Read)?;
            if ext.absorb(&mut e)? {
                continue;
            }
            let taken = std::mem::take(&mut ext);
            out = Some((
                taken.path(&e).into_owned(),
                taken.link(&e).map(Cow::into_owned),
            ));
        }
        ext.finish()?;
        Ok(out.expect("one entry"))
    }

    fn pax(records: &[(&str, &str)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (k, v) in records {
            let body = format!(" {k}={v}\n");
            // The length counts itself: find the fixed point.
            let mut n = body.len() + 1;
            while format!("{n}{body}").len() != n {
                n += 1;
            }
            out.extend_from_slice(format!("{n}{body}").as_bytes());
        }
        out
    }

    #[test]
    fn long_names_and_pax_records_name_the_next_entry() {
        let long = "d/".repeat(200) + "f";
        let mut name = long.clone().into_bytes();
        name.push(0);
        assert_eq!(
            read(&archive(EntryType::GNULongName, &name)).unwrap().0,
            long.as_bytes()
        );
        let (path, link) = read(&archive(
            EntryType::XHeader,
            &pax(&[("path", "a/b"), ("linkpath", "t"), ("path", "c")]),
        ))
        .unwrap();
        assert_eq!((path, link), (b"c".to_vec(), Some(b"t".to_vec())));
        // A global header is dropped; the header's own fields stay.
        let (path, link) =
            read(&archive(EntryType::XGlobalHeader, &pax(&[("path", "g")]))).unwrap();
        assert_eq!((path, link), (b"f".to_vec(), Some(b"short".to_vec())));
    }

    #[test]
    fn oversize_headers_are_refused_before_they_are_read() {
        for (ty, max) in [
            (EntryType::XHeader, MAX_PAX_BYTES),
            (EntryType::GNULongName, MAX_NAME_BYTES),
            (EntryType::GNULongLink, MAX_NAME_BYTES),
        ] {
            assert!(read(&archive(ty, &vec![b'a'; max as usize])).is_ok());
            let err = read(&archive(ty, &vec![b'a'; max as usize + 1])).unwrap_err();
            assert!(
                matches!(&err, ExtError::Refused(m) if m.contains("larger than")),
                "{err}"
            );
        }
        // A header claiming far more than the archive holds is refused on its claim alone
        // (nothing allocated for it).
        let mut data = archive(EntryType::XHeader, b"");
        let mut h = tar::Header::new_ustar();
        h.as_mut_bytes().copy_from_slice(&data[..512]);
        h.set_size(900 << 20);
        h.set_cksum();
        data[..512].copy_from_slice(h.as_bytes());
        let err = read(&data).unwrap_err();
        assert!(
            matches!(&err, ExtError::Refused(m) if m.contains("larger than")),
            "{err}"
        );
    }

    #[test]
    fn repeated_dangling_and_malformed_headers_are_refused() {
        let mut two = archive(EntryType::GNULongName, b"a\0");
        two.splice(
            0..0,
            archive(EntryType::GNULongName, b"b\0")[..1024].to_vec(),
        );
        assert!(matches!(read(&two), Err(ExtError::Refused(m)) if m.contains("two long names")));
        let mut dangling = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(EntryType::XHeader);
        h.set_size(0);
        h.set_path("pax").unwrap();
        h.set_cksum();
        dangling.append(&h, &b""[..]).unwrap();
        let data = dangling.into_inner().unwrap();
        let mut a = tar::Archive::new(&data[..]);
        let mut ext = Extensions::default();
        for e in a.entries().unwrap().raw(true) {
            assert!(ext.absorb(&mut e.unwrap()).unwrap());
        }
        assert!(ext.finish().is_err());
        let mut globals = archive(EntryType::XGlobalHeader, b"");
        globals.splice(0..0, archive(EntryType::XGlobalHeader, b"")[..512].to_vec());
        assert!(matches!(read(&globals), Err(ExtError::Refused(m)) if m.contains("two global")));
        let bad = Extensions {
            pax: Some(b"99 path=x\n".to_vec()),
            ..Default::default()
        };
        assert!(bad.records().next().unwrap().is_err());
        assert_eq!(pax_number(b"1700000000.25"), Some(1_700_000_000));
        assert_eq!(pax_number(b"-1"), None);
    }
}
