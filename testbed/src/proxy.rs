//! A local TCP proxy (`selfheal-testbed proxy --listen A --upstream B`):
//! every accepted connection is joined to a new connection to the upstream
//! and bytes are copied both ways until either side closes. It stands for
//! a sidecar or gateway on the caller's own host: the caller's connection
//! ends at the proxy, whose kernel answers keepalive probes even when the
//! proxy's own flow to the provider is dead.
//!
//! With `--tls-cert` and `--tls-key` it is a TLS edge instead: it
//! terminates TLS from callers and forwards the plaintext, as the edge in
//! front of a real provider does, each read from the provider sent on as
//! it comes (one TLS record, flushed). A caller then sees only what TLS
//! shows: sizes and times, never content.

use std::{net::SocketAddr, path::PathBuf, sync::Arc};

use anyhow::Context as _;
use tokio_rustls::{
    TlsAcceptor,
    rustls::{
        ServerConfig,
        pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _},
    },
};

use super::say;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Address to accept callers on.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Where to forward each connection.
    #[arg(long)]
    pub upstream: SocketAddr,
    /// Terminate TLS with this certificate chain (PEM)...
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// ...and this private key (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// The TLS acceptor for `cert` and `key`.
fn acceptor(cert: &PathBuf, key: &PathBuf) -> anyhow::Result<TlsAcceptor> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("cannot read the certificates in {}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("cannot read the private key in {}", key.display()))?;
    let config = ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("the certificate and key do not make a TLS server")?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(acceptor(cert, key)?),
        _ => None,
    };
    super::runtime()?.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen).await?;
        say(format!(
            "listening proxy={} upstream={} tls={}",
            args.listen,
            args.upstream,
            tls.is_some()
        ));
        loop {
            let Ok((mut inbound, from)) = listener.accept().await else {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            };
            let upstream = args.upstream;
            let tls = tls.clone();
            tokio::spawn(async move {
                let mut outbound = match tokio::net::TcpStream::connect(upstream).await {
                    Ok(s) => s,
                    Err(e) => {
                        say(format!("upstream {upstream} for {from}: {e}"));
                        return;
                    }
                };
                let local = outbound
                    .local_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_default();
                say(format!("forwarding from={from} via={local} to={upstream}"));
                let r = match tls {
                    None => tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await,
                    Some(tls) => match tls.accept(inbound).await {
                        Ok(mut inbound) => {
                            tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await
                        }
                        Err(e) => Err(e),
                    },
                };
                say(format!("closed from={from} via={local}: {r:?}"));
            });
        }
    })
}
