//! Object-store faults that are the store's or the network's, not the table's: a refused or
//! timed-out connection (transient: a retry may succeed), missing or rejected credentials and a
//! 403 (unavailable: someone has to fix access). They must never be mistaken for a damaged Delta
//! log or a damaged data file, whose advice (restore, move aside, full reload) is destructive.

use std::error::Error;

use crate::error::ErrorClass;

/// What went wrong talking to an object store, summarised in one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreFault {
    /// Retryable (connection refused, timeout), Unavailable (credentials, 401/403, a missing
    /// bucket) or Config (the client cannot be set up for the endpoint).
    pub class: ErrorClass,
    /// One line: the store and the cause, without the request dump.
    pub cause: String,
    /// What to do, when it is not the class's usual advice.
    hint: Option<&'static str>,
}

impl StoreFault {
    fn transient(store: &str, what: &str) -> Self {
        StoreFault {
            class: ErrorClass::Retryable,
            cause: format!("{store}: {what}"),
            hint: None,
        }
    }

    fn refused(store: &str, what: &str) -> Self {
        StoreFault {
            class: ErrorClass::Unavailable,
            cause: format!("{store}: {what}"),
            hint: None,
        }
    }

    fn with_hint(self, class: ErrorClass, hint: &'static str) -> Self {
        StoreFault {
            class,
            hint: Some(hint),
            ..self
        }
    }

    /// What to do about it, for the end of an error message.
    pub fn advice(&self) -> &'static str {
        if let Some(hint) = self.hint {
            return hint;
        }
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
    in_text(&err.to_string())
}

/// A transport failure that reached us only as text: DataFusion reports a failed footer read
/// as "Failed to fetch metadata for file …: <the store's error>" in a string, without the
/// object-store error as a source.
fn in_text(text: &str) -> Option<StoreFault> {
    if !text.contains("Error performing ") {
        return None;
    }
    let what = if text.contains("error sending request") || text.contains("connection closed") {
        "the connection failed mid-request"
    } else if text.contains("Connection refused") {
        "cannot connect to the endpoint"
    } else if text.contains("timed out") {
        "the request timed out"
    } else {
        return None;
    };
    let store = match endpoint(text) {
        Some(at) => format!("store at {at}"),
        None => "store".to_string(),
    };
    Some(StoreFault::transient(
        &store,
        &format!("{what}{}", retries(text)),
    ))
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
            // A bucket that does not exist, or a name no bucket can have: the location is wrong.
            _ if text.contains("NoSuchBucket") => Some(
                StoreFault::refused(store, "the bucket named in the URI does not exist (404 NoSuchBucket)")
                    .with_hint(ErrorClass::Unavailable, "nothing was read or written; check the bucket name in the URI (and AWS_ENDPOINT_URL: the bucket may live on another endpoint), then rerun"),
            ),
            _ if text.contains("InvalidBucketName") => Some(
                StoreFault::refused(store, "the store refused the bucket name (400 InvalidBucketName)")
                    .with_hint(ErrorClass::Config, "nothing was read or written; S3 bucket names are lower-case letters, digits, dots and hyphens: fix the URI, then rerun"),
            ),
            // reqwest refuses to build an http:// request unless plain HTTP is allowed.
            _ if text.contains("builder error") && text.contains("http://") => Some(
                StoreFault::refused(store, "the client refused to use a plain-HTTP endpoint")
                    .with_hint(ErrorClass::Config, "nothing was read or written; the endpoint (AWS_ENDPOINT_URL) is http://: set AWS_ALLOW_HTTP=true for it (or use its https:// address), then rerun"),
            ),
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

    #[test]
    fn a_transport_failure_known_only_as_text_is_transient() {
        let text = "Failed to fetch metadata for file bronze/part-0.parquet: Generic S3 error: Error performing GET http://127.0.0.1:9600/lake/bronze/part-0.parquet in 3s, after 10 retries, max_retries: 10, retry_timeout: 180s - HTTP error: error sending request";
        let e = datafusion::error::DataFusionError::External(Box::new(
            parquet::errors::ParquetError::General(text.to_string()),
        ));
        let f = store_fault(&e).expect("a store fault");
        assert_eq!(f.class, ErrorClass::Retryable);
        assert!(f.cause.contains("http://127.0.0.1:9600"), "{}", f.cause);
        assert!(f.cause.contains("10 retries"), "{}", f.cause);
        assert!(
            !f.cause.contains("part-0"),
            "no path in the cause: {}",
            f.cause
        );
        let damaged = datafusion::error::DataFusionError::External(Box::new(
            parquet::errors::ParquetError::General("Invalid Parquet file. Corrupt footer".into()),
        ));
        assert_eq!(store_fault(&damaged), None);
    }

    #[test]
    fn missing_buckets_bad_names_and_plain_http_are_not_transient() {
        let fault = |text: &str| {
            store_fault(&object_store::Error::Generic {
                store: "S3",
                source: text.to_string().into(),
            })
        };
        let f = fault("Error performing list request: 404 Not Found: <Code>NoSuchBucket</Code>")
            .expect("a store fault");
        assert_eq!(f.class, ErrorClass::Unavailable);
        assert!(f.advice().contains("bucket name"));
        let f = fault("400 Bad Request <Code>InvalidBucketName</Code>").expect("a store fault");
        assert_eq!(f.class, ErrorClass::Config);
        let f = fault("Error performing GET http://localhost:9000/b - HTTP error: builder error")
            .expect("a store fault");
        assert_eq!(f.class, ErrorClass::Config);
        assert!(f.advice().contains("AWS_ALLOW_HTTP=true"));
    }
}
