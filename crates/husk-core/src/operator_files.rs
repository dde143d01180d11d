//! Small files an operator gives husk by path (the cluster token, a listener's certificate and
//! key, a cluster's CA), read whole and bounded. The server reads them at start; a node's or a
//! server's state helper reads them again on request (the server runs unprivileged and
//! cannot), so both read them here, with the same bounds.

use std::io::Read;
use std::path::Path;

use zeroize::Zeroizing;

/// Largest cluster token file (a few tokens during a rotation, with room to spare).
pub const MAX_TOKEN_FILE: usize = 16 << 10;
/// Largest certificate chain or CA bundle file (a leaf and a few intermediates, or a few CAs).
pub const MAX_CERT_FILE: usize = 64 << 10;
/// Largest private key file.
pub const MAX_KEY_FILE: usize = 16 << 10;

/// Why a file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("larger than {max} bytes")]
    TooLarge { max: usize },
}

/// The file at `path`, whole, if it holds at most `max` bytes (no more is read).
pub fn read(path: &Path, max: usize) -> Result<Zeroizing<Vec<u8>>, ReadError> {
    let file = std::fs::File::open(path)?;
    let mut bytes = Zeroizing::new(Vec::new());
    file.take(max as u64 + 1).read_to_end(&mut bytes)?;
    if bytes.len() > max {
        return Err(ReadError::TooLarge { max });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_read_whole_up_to_its_bound_and_not_past_it() {
        let dir = std::env::temp_dir().join(format!("husk-operator-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let at = dir.join("f");
        std::fs::write(&at, vec![b'a'; 10]).unwrap();
        let exact = read(&at, 10).map(|b| b.len());
        let over = read(&at, 9);
        let missing = read(&dir.join("none"), 10);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(exact.unwrap(), 10);
        assert!(matches!(over, Err(ReadError::TooLarge { max: 9 })));
        assert!(
            matches!(missing, Err(ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound)
        );
    }
}
