//! `kleym crds`: print our CRDs, or write them as one file each (the Helm chart's copy).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;

/// Arguments of `kleym crds`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Instead of printing them, write each CRD to its own file in this directory
    /// (`<group>_<plural>.yaml`, overwriting a file of that name), as the Helm chart's
    /// `crds/` holds them: `kleym crds --write charts/kleym/crds` regenerates the chart's
    /// copy after a change to the API types. The directory must exist.
    #[arg(long, value_name = "DIR")]
    pub write: Option<PathBuf>,
}

/// Write every kleym CRD to `out` as multi-document YAML, or with `--write` into its directory
/// (one line per file written goes to `out`).
pub fn run(args: &Args, out: &mut impl Write) -> anyhow::Result<()> {
    match &args.write {
        None => {
            let yaml = kleym_api::crds::to_yaml().context("rendering CRDs")?;
            out.write_all(yaml.as_bytes()).context("writing CRDs")?;
        }
        Some(dir) => {
            if !dir.is_dir() {
                anyhow::bail!("--write {}: not a directory", dir.display());
            }
            for crd in kleym_api::crds::all() {
                let path = dir.join(kleym_api::crds::file_name(&crd));
                let yaml = kleym_api::crds::crd_to_yaml(&crd).context("rendering CRDs")?;
                // A whole file or none: written beside the target, then renamed over it.
                let tmp = dir.join(format!(".{}.tmp", kleym_api::crds::file_name(&crd)));
                std::fs::write(&tmp, &yaml)
                    .with_context(|| format!("--write: writing {}", tmp.display()))?;
                std::fs::rename(&tmp, &path)
                    .with_context(|| format!("--write: replacing {}", path.display()))?;
                writeln!(out, "wrote {}", path.display()).context("writing to stdout")?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_every_crd_as_its_own_document() {
        let mut out = Vec::new();
        run(&Args { write: None }, &mut out).unwrap();
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

    #[test]
    fn write_puts_each_crd_in_its_own_file_and_replaces_a_stale_one() {
        let dir = tempfile::tempdir().unwrap();
        let first = kleym_api::crds::all().remove(0);
        let stale = dir.path().join(kleym_api::crds::file_name(&first));
        std::fs::write(&stale, "stale").unwrap();
        let mut out = Vec::new();
        run(
            &Args {
                write: Some(dir.path().to_path_buf()),
            },
            &mut out,
        )
        .unwrap();
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let mut want: Vec<String> = kleym_api::crds::all()
            .iter()
            .map(kleym_api::crds::file_name)
            .collect();
        want.sort();
        assert_eq!(names, want, "one file per CRD, no temporary left");
        let doc: serde_json::Value =
            kleym_api::yaml::from_str(&std::fs::read_to_string(&stale).unwrap()).unwrap();
        assert_eq!(
            doc["metadata"]["name"],
            "inferenceidentitybindings.kleym.io"
        );
        assert_eq!(
            String::from_utf8(out).unwrap().lines().count(),
            want.len(),
            "one line per file written"
        );
    }

    #[test]
    fn write_refuses_a_missing_directory_and_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let err = run(
            &Args {
                write: Some(missing.clone()),
            },
            &mut Vec::new(),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains(&missing.display().to_string()),
            "{err}"
        );
    }
}
