//! The Redis Stream sink: one `XADD key MAXLEN ~ n * event <json>`
//! per event, a batch per pipeline. Backends read with consumer groups
//! (`XREADGROUP`) at their own pace; the stream keeps about `maxlen` entries.

use async_trait::async_trait;
use bytes::Bytes;

use super::{Deliver, DeliverError};
use crate::redis_conn::RedisHandle;

pub struct Stream {
    redis: RedisHandle,
    key: String,
    maxlen: u64,
}

impl Stream {
    pub fn new(redis: RedisHandle, key: &str, maxlen: u64) -> Self {
        Self {
            redis,
            key: key.to_owned(),
            maxlen,
        }
    }
}

#[async_trait]
impl Deliver for Stream {
    async fn deliver(&self, events: &[Bytes]) -> Result<(), DeliverError> {
        let mut p = redis::pipe();
        for e in events {
            p.cmd("XADD")
                .arg(&self.key)
                .arg("MAXLEN")
                .arg("~")
                .arg(self.maxlen)
                .arg("*")
                .arg("event")
                .arg(e.as_ref())
                .ignore();
        }
        let mut c = self.redis.conn();
        match tokio::time::timeout(self.redis.timeout(), p.query_async::<()>(&mut c)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(DeliverError::Unreachable {
                target: format!("XADD {}", self.key),
                reason: e.to_string(),
            }),
            Err(_) => Err(DeliverError::Timeout {
                target: format!("XADD {}", self.key),
            }),
        }
    }
}
