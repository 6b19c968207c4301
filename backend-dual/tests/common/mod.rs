//! What the dual test binaries share: connecting a store URL of any kind these tests use, and
//! a dual URL over two of them.
#![allow(dead_code)]

use std::sync::Arc;

use lockcore::{DistributedLock, MemoryLock, Result};

/// Connects one store URL (`memory://`, `zk://`, `redis://`), as the facade would.
pub async fn store(url: String) -> Result<Arc<dyn DistributedLock>> {
    if url.starts_with("memory:") {
        Ok(Arc::new(MemoryLock::from_url(&url)?))
    } else if url.starts_with("zk:") {
        backend_zk::connect(&url).await
    } else {
        backend_redis::connect(&url).await
    }
}

/// Connects a `dual://` URL over stores [`store`] knows.
pub async fn dual(url: String) -> Result<Arc<dyn DistributedLock>> {
    backend_dual::connect(&url, store).await
}

/// Percent-encodes a whole URL for a query value.
pub fn enc(url: &str) -> String {
    url::form_urlencoded::byte_serialize(url.as_bytes()).collect()
}

/// `dual://?first=..&second=..` with both URLs encoded, plus `extra` options.
pub fn dual_url(first: &str, second: &str, extra: &str) -> String {
    let mut url = format!("dual://?first={}&second={}", enc(first), enc(second));
    if !extra.is_empty() {
        url.push('&');
        url.push_str(extra);
    }
    url
}
