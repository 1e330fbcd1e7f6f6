//! The shared token between commscope's parts (`--auth-token-file`): agents, the TUI and the
//! simulator send it as `authorization: Bearer <token>` on their gRPC streams, HTTP clients in
//! the same header; the collector refuses requests without it (docs/security.md).

use tonic::metadata::MetadataValue;
use tonic::{Request, Status};

/// The header both gRPC and HTTP carry the token in.
pub const HEADER: &str = "authorization";

/// A secret shared by the collector and its clients.
#[derive(Clone)]
pub struct Token {
    secret: String,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(…)")
    }
}

impl Token {
    /// Reads a token file: its first line, trimmed. Empty, or with characters a header cannot
    /// carry, is an error naming the file.
    pub fn from_file(path: &std::path::Path) -> Result<Token, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the token file {}: {e}", path.display()))?;
        Token::new(text.lines().next().unwrap_or("").trim())
            .map_err(|e| format!("the token file {}: {e}", path.display()))
    }

    /// A token from its text.
    pub fn new(secret: &str) -> Result<Token, String> {
        if secret.is_empty() {
            return Err("the token is empty".into());
        }
        if !secret.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("the token may hold printable ASCII only, without spaces".into());
        }
        Ok(Token {
            secret: secret.to_owned(),
        })
    }

    /// `Bearer <token>`: the header's value.
    pub fn header_value(&self) -> String {
        format!("Bearer {}", self.secret)
    }

    /// Whether a request's `authorization` header carries this token. The comparison takes the
    /// same time wherever the first difference is.
    pub fn accepts(&self, header: Option<&[u8]>) -> bool {
        let Some(given) = header.and_then(|h| h.strip_prefix(b"Bearer ")) else {
            return false;
        };
        let want = self.secret.as_bytes();
        let mut diff = u8::from(given.len() != want.len());
        for (i, w) in want.iter().enumerate() {
            diff |= w ^ given.get(i).copied().unwrap_or(0);
        }
        diff == 0
    }

    /// A gRPC client interceptor that adds the token to every request.
    pub fn interceptor(
        token: Option<Token>,
    ) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
        let value = token.and_then(|t| MetadataValue::try_from(t.header_value()).ok());
        move |mut req: Request<()>| {
            if let Some(v) = &value {
                req.metadata_mut().insert(HEADER, v.clone());
            }
            Ok(req)
        }
    }

    /// Checks a gRPC request's token: `Unauthenticated` without it.
    pub fn check<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let header = req.metadata().get(HEADER).map(MetadataValue::as_bytes);
        if self.accepts(header) {
            Ok(())
        } else if header.is_none() {
            Err(Status::unauthenticated(
                "this collector requires a token: give the client --auth-token-file",
            ))
        } else {
            Err(Status::unauthenticated("the token is not this collector's"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_accepts_its_own_bearer_header_and_nothing_else() {
        let t = Token::new("s3cret-Tok3n").expect("token");
        assert!(t.accepts(Some(b"Bearer s3cret-Tok3n")));
        for bad in [
            &b"Bearer s3cret-Tok3"[..],
            b"Bearer s3cret-Tok3nn",
            b"bearer s3cret-Tok3n",
            b"s3cret-Tok3n",
            b"Bearer ",
            b"",
        ] {
            assert!(!t.accepts(Some(bad)), "{}", String::from_utf8_lossy(bad));
        }
        assert!(!t.accepts(None));
        assert!(Token::new("").is_err());
        assert!(Token::new("two words").is_err());
        assert_eq!(format!("{t:?}"), "Token(…)");

        let mut add = Token::interceptor(Some(t.clone()));
        let req = add(Request::new(())).expect("request");
        assert!(t.check(&req).is_ok());
        let bare = Request::new(());
        assert_eq!(
            t.check(&bare).expect_err("refused").code(),
            tonic::Code::Unauthenticated
        );
    }

    #[test]
    fn a_token_file_gives_its_first_line_trimmed() {
        let dir = std::env::temp_dir().join(format!("cs-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let f = dir.join("token");
        std::fs::write(&f, "  abc123  \nignored\n").expect("write");
        let t = Token::from_file(&f).expect("token");
        assert!(t.accepts(Some(b"Bearer abc123")));
        std::fs::write(&f, "\n").expect("write");
        let e = Token::from_file(&f).expect_err("empty");
        assert!(e.contains("token is empty"), "{e}");
        let e = Token::from_file(&dir.join("absent")).expect_err("absent");
        assert!(e.contains("cannot read the token file"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
