//! Object-store faults that are the store's or the network's, not the table's: a refused or
//! timed-out connection (transient: a retry may succeed), missing or rejected credentials and a
//! 403 (unavailable: someone has to fix access). They must never be mistaken for a damaged Delta
//! log or a damaged data file, whose advice (restore, move aside, full reload) is destructive.

use std::error::Error;

use crate::error::ErrorClass;

/// What went wrong talking to an object store, summarised in one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreFault {
    /// Retryable (connection refused, timeout) or Unavailable (credentials, 401/403).
    pub class: ErrorClass,
    /// One line: the store and the cause, without the request dump.
    pub cause: String,
}

impl StoreFault {
    fn transient(store: &str, what: &str) -> Self {
        StoreFault {
            class: ErrorClass::Retryable,
            cause: format!("{store}: {what}"),
        }
    }

    fn refused(store: &str, what: &str) -> Self {
        StoreFault {
            class: ErrorClass::Unavailable,
            cause: format!("{store}: {what}"),
        }
    }

    /// What to do about it, for the end of an error message.
    pub fn advice(&self) -> &'static str {
        if self.class == ErrorClass::Retryable {
            "the table was not read, and nothing points at its data or log; check that the store's endpoint (AWS_ENDPOINT_URL) is up and reachable, then rerun the same command (exit 75: safe to retry)"
        } else {
            "the table was not read, and nothing points at its data or log; check the store's credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or the role) and its access policy for this location, then rerun"
        }
    }
}

/// Finds a store or network fault anywhere in an error's chain, including inside a delta-rs
/// kernel error (which does not expose its object-store error as a `source()`).
pub fn store_fault(err: &(dyn Error + 'static)) -> Option<StoreFault> {
    let mut next: Option<&(dyn Error + 'static)> = Some(err);
    while let Some(e) = next {
        if let Some(found) = at(e) {
            return Some(found);
        }
        next = match kernel_store_error(e) {
            Some(o) => Some(o),
            None => crate::error::next_in_chain(e),
        };
    }
    None
}

/// The object-store error inside a kernel error (at any depth of the kernel's backtrace wrapper).
fn kernel_store_error<'a>(e: &'a (dyn Error + 'static)) -> Option<&'a (dyn Error + 'static)> {
    let mut kernel = match e.downcast_ref::<deltalake::DeltaTableError>() {
        Some(deltalake::DeltaTableError::KernelError(k)) => k,
        _ => e.downcast_ref::<delta_kernel::Error>()?,
    };
    loop {
        match kernel {
            delta_kernel::Error::Backtraced { source, .. } => kernel = source,
            delta_kernel::Error::ObjectStore(o) => return Some(o),
            delta_kernel::Error::Reqwest(r) => return Some(r),
            _ => return None,
        }
    }
}

/// The fault this one error (not its chain) stands for, if any.
fn at(e: &(dyn Error + 'static)) -> Option<StoreFault> {
    use object_store::client::HttpErrorKind as K;
    if let Some(o) = e.downcast_ref::<object_store::Error>() {
        let text = o.to_string();
        let kind = match o {
            object_store::Error::Generic { store, .. } => store,
            _ => "store",
        };
        let store = match endpoint(&text) {
            Some(at) => format!("{kind} at {at}"),
            None => kind.to_string(),
        };
        let store = store.as_str();
        // Credentials fetched from the instance metadata service: with no key in the environment
        // the AWS client asks it, and on a machine without one that fails.
        if text.contains("169.254.169.254") || text.contains("169.254.170.2") {
            return Some(StoreFault::refused(
                store,
                "no credentials: none in the environment, and the instance metadata service gave none",
            ));
        }
        return match o {
            object_store::Error::PermissionDenied { path, .. } => Some(StoreFault::refused(
                store,
                &format!("access to {path} denied (403): the credentials lack permission, or are wrong"),
            )),
            object_store::Error::Unauthenticated { path, .. } => Some(StoreFault::refused(
                store,
                &format!("request for {path} not authenticated (401): the credentials are missing or wrong"),
            )),
            // S3 answers a wrong key or signature with 403 and a code the client keeps as text.
            _ if ["InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403 Forbidden"]
                .iter()
                .any(|c| text.contains(c)) =>
            {
                Some(StoreFault::refused(
                    store,
                    "the store refused the credentials (403): the access key is unknown or the secret is wrong",
                ))
            }
            _ => {
                // A transport failure below the generic error (next in the chain).
                let mut inner = o.source();
                while let Some(i) = inner {
                    if let Some(h) = i.downcast_ref::<object_store::client::HttpError>() {
                        return match h.kind() {
                            K::Connect => Some(StoreFault::transient(
                                store,
                                &format!("cannot connect to the endpoint{}", retries(&text)),
                            )),
                            K::Timeout => Some(StoreFault::transient(
                                store,
                                &format!("the request timed out{}", retries(&text)),
                            )),
                            K::Request | K::Interrupted => Some(StoreFault::transient(
                                store,
                                &format!("the connection failed mid-request{}", retries(&text)),
                            )),
                            K::Decode | K::Unknown => None,
                            #[allow(unreachable_patterns)]
                            _ => None,
                        };
                    }
                    inner = i.source();
                }
                // A server-side hiccup (500, 502, 503 SlowDown) that outlasted the client's retries.
                [
                    "500 Internal Server Error",
                    "502 Bad Gateway",
                    "503 Service Unavailable",
                    "504 Gateway Timeout",
                ]
                .iter()
                .find(|c| text.contains(*c))
                .map(|c| StoreFault::transient(store, &format!("the store answered {c}")))
            }
        };
    }
    None
}

/// The scheme and host of the first URL in a store's message (never a path or a query, which
/// could carry a presigned token).
fn endpoint(text: &str) -> Option<&str> {
    let start = text.find("http://").or_else(|| text.find("https://"))?;
    let url = &text[start..];
    let host_start = url.find("://")? + 3;
    let end = url[host_start..]
        .find(|c: char| c == '/' || c.is_whitespace())
        .map_or(url.len(), |i| host_start + i);
    Some(&url[..end])
}

/// ", after N retries" when the client said how often it retried.
fn retries(text: &str) -> String {
    text.split("after ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse::<u32>().ok())
        .map(|n| format!(" (gave up after {n} retries)"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permission_and_credentials_are_unavailable() {
        let denied = deltalake::DeltaTableError::ObjectStore {
            source: object_store::Error::PermissionDenied {
                path: "b/t/_delta_log/0.json".into(),
                source: "403".into(),
            },
        };
        let f = store_fault(&denied).expect("a store fault");
        assert_eq!(f.class, ErrorClass::Unavailable);
        let kernel = deltalake::DeltaTableError::KernelError(delta_kernel::Error::ObjectStore(
            object_store::Error::Generic {
                store: "S3",
                source: "Error performing PUT http://169.254.169.254/latest/api/token".into(),
            },
        ));
        let f = store_fault(&kernel).expect("a store fault");
        assert_eq!(f.class, ErrorClass::Unavailable);
        assert!(f.cause.contains("no credentials"), "{}", f.cause);
        let other = deltalake::DeltaTableError::InvalidJsonLog {
            json_err: serde_json::from_str::<u8>("x").expect_err("bad json"),
            line: "x".into(),
            version: 0,
        };
        assert_eq!(store_fault(&other), None);
    }
}
