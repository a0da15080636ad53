//! A real Kafka-protocol broker on loopback for the Kafka ingest tests: tansu 0.6 with its
//! in-memory engine, killed when the guard drops. `scripts/test.sh` installs it into
//! target/tools; set `TANSU` to use another binary. Topics are created explicitly, and every
//! record is produced by its own produce call: tansu's memory engine keeps offsets per batch.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use rskafka::client::partition::{Compression, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use rskafka::record::Record;

/// Where a Kafka ingest's incremental run can be killed (failpoints
/// `ingest.incremental.<point>`), in the order the run passes them.
pub const INCREMENTAL_POINTS: [&str; 6] = [
    "after_plan",
    "after_read",
    "after_validate",
    "before_commit",
    "committed_target",
    "after_commit",
];

/// A running broker; killed on drop.
pub struct Kafka {
    child: Child,
    pub addr: String,
}

impl Drop for Kafka {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tansu_binary() -> PathBuf {
    if let Ok(p) = std::env::var("TANSU") {
        return PathBuf::from(p);
    }
    let local = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/tools/bin/tansu");
    if local.exists() {
        return local;
    }
    PathBuf::from("tansu") // on PATH
}

/// Starts a broker on a free loopback port and waits until it accepts connections.
pub fn start() -> Kafka {
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("free port")
        .local_addr()
        .expect("addr")
        .port();
    let url = format!("tcp://127.0.0.1:{port}");
    let child = Command::new(tansu_binary())
        .args(["broker", "--listener-url", &url, "--advertised-listener-url", &url])
        .args(["--storage-engine", "memory://tansu/", "--silent"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot start tansu ({e}); run the tests with scripts/test.sh, which installs it (or set TANSU)")
        });
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "tansu did not listen on port {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Kafka {
        child,
        addr: format!("127.0.0.1:{port}"),
    }
}

/// A message to produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Msg {
    pub partition: i32,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: BTreeMap<String, Vec<u8>>,
    pub timestamp: DateTime<Utc>,
}

impl Kafka {
    async fn client(&self) -> Client {
        tokio::time::timeout(
            Duration::from_secs(20),
            ClientBuilder::new(vec![self.addr.clone()]).build(),
        )
        .await
        .expect("connect in time")
        .expect("connect")
    }

    /// Creates `topic` with `partitions` partitions.
    pub async fn create_topic(&self, topic: &str, partitions: i32) {
        let c = self.client().await;
        let ctl = c.controller_client().expect("controller");
        tokio::time::timeout(
            Duration::from_secs(20),
            ctl.create_topic(topic, partitions, 1, 5_000),
        )
        .await
        .expect("create topic in time")
        .expect("create topic");
    }

    /// Produces each message by its own produce call; returns their offsets.
    pub async fn produce(&self, topic: &str, msgs: &[Msg]) -> Vec<i64> {
        let c = self.client().await;
        let mut out = Vec::new();
        for m in msgs {
            let pc = c
                .partition_client(topic, m.partition, UnknownTopicHandling::Retry)
                .await
                .expect("partition client");
            let rec = Record {
                key: m.key.clone(),
                value: m.value.clone(),
                headers: m.headers.clone(),
                timestamp: m.timestamp,
            };
            let offs = tokio::time::timeout(
                Duration::from_secs(20),
                pc.produce(vec![rec], Compression::NoCompression),
            )
            .await
            .expect("produce in time")
            .expect("produce");
            out.extend(offs);
        }
        out
    }
}
