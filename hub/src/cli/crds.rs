//! `kleym crds`: print our CRDs.

use std::io::Write;

use anyhow::Context;

/// Arguments of `kleym crds` (none yet).
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Write every kleym CRD to `out` as multi-document YAML.
pub fn run(_args: &Args, out: &mut impl Write) -> anyhow::Result<()> {
    let yaml = kleym_api::crds::to_yaml().context("rendering CRDs")?;
    out.write_all(yaml.as_bytes()).context("writing CRDs")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_every_crd_as_its_own_document() {
        let mut out = Vec::new();
        run(&Args {}, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let docs: Vec<serde_json::Value> = text
            .split("---\n")
            .filter(|d| !d.trim().is_empty())
            .map(|d| kleym_api::yaml::from_str(d).unwrap())
            .collect();
        assert_eq!(docs.len(), kleym_api::crds::all().len());
        assert_eq!(docs[0]["kind"], "CustomResourceDefinition");
        assert_eq!(
            docs[0]["metadata"]["name"],
            "inferenceidentitybindings.kleym.io"
        );
    }
}
