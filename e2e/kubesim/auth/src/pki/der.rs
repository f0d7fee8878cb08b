//! Just enough DER to rewrite a certificate's subject.
//!
//! rcgen's `DistinguishedName` holds one value per attribute type, but Kubernetes reads every
//! `O` attribute of a client certificate as a group, so a user in several groups needs several
//! `O` attributes. We let rcgen build and sign the certificate, splice in a subject we encode
//! ourselves, and sign the new TBSCertificate again with the CA key.

use crate::{AuthError, Result};

const TAG_SEQUENCE: u8 = 0x30;
const TAG_SET: u8 = 0x31;
const TAG_OID: u8 = 0x06;
const TAG_UTF8_STRING: u8 = 0x0c;
const TAG_BIT_STRING: u8 = 0x03;

/// DER of the OID 2.5.4.3 (commonName).
const OID_COMMON_NAME: [u8; 3] = [0x55, 0x04, 0x03];
/// DER of the OID 2.5.4.10 (organizationName).
const OID_ORGANIZATION: [u8; 3] = [0x55, 0x04, 0x0a];

fn malformed() -> AuthError {
    AuthError::Pki("malformed DER in generated certificate".into())
}

/// Encodes a TLV with a definite length.
pub(crate) fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}

/// Splits `input` into its first TLV (whole encoding) and the rest.
fn split_tlv(input: &[u8]) -> Result<(&[u8], &[u8])> {
    let first_len = *input.get(1).ok_or_else(malformed)?;
    let (header, len) = if first_len < 0x80 {
        (2usize, first_len as usize)
    } else {
        let n = (first_len & 0x7f) as usize;
        if n == 0 || n > 4 {
            return Err(malformed());
        }
        let bytes = input.get(2..2 + n).ok_or_else(malformed)?;
        let len = bytes.iter().fold(0usize, |acc, b| (acc << 8) | *b as usize);
        (2 + n, len)
    };
    let end = header.checked_add(len).ok_or_else(malformed)?;
    if input.len() < end {
        return Err(malformed());
    }
    Ok(input.split_at(end))
}

/// The content octets of a TLV.
fn content(tlv: &[u8]) -> Result<&[u8]> {
    let (whole, _) = split_tlv(tlv)?;
    let first_len = whole[1];
    let header = if first_len < 0x80 {
        2
    } else {
        2 + (first_len & 0x7f) as usize
    };
    Ok(&whole[header..])
}

/// All TLVs inside a constructed TLV.
fn children(tlv: &[u8]) -> Result<Vec<&[u8]>> {
    let mut rest = content(tlv)?;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let (item, tail) = split_tlv(rest)?;
        out.push(item);
        rest = tail;
    }
    Ok(out)
}

/// A Name with one CN and one RDN per organization, in order.
pub(crate) fn encode_name(common_name: &str, organizations: &[String]) -> Vec<u8> {
    let attr = |oid: &[u8], value: &str| {
        let mut seq = tlv(TAG_OID, oid);
        seq.extend(tlv(TAG_UTF8_STRING, value.as_bytes()));
        tlv(TAG_SET, &tlv(TAG_SEQUENCE, &seq))
    };
    let mut rdns = Vec::new();
    for org in organizations {
        rdns.extend(attr(&OID_ORGANIZATION, org));
    }
    rdns.extend(attr(&OID_COMMON_NAME, common_name));
    tlv(TAG_SEQUENCE, &rdns)
}

/// Replaces the subject of `cert_der` with `subject_der` and re-signs the TBSCertificate with
/// `sign` (which must be the issuer's key, with the algorithm the certificate already names).
pub(crate) fn replace_subject(
    cert_der: &[u8],
    subject_der: &[u8],
    sign: impl FnOnce(&[u8]) -> Result<Vec<u8>>,
) -> Result<Vec<u8>> {
    let parts = children(cert_der)?;
    let [tbs, sig_alg, _sig] = parts.as_slice() else {
        return Err(malformed());
    };
    let mut fields = children(tbs)?;
    // version [0], serial, signature, issuer, validity, subject, ... (version is always
    // present in the v3 certificates rcgen writes).
    if fields.len() < 7 || fields[0].first() != Some(&0xa0) {
        return Err(malformed());
    }
    fields[5] = subject_der;
    let new_tbs = tlv(TAG_SEQUENCE, &fields.concat());
    let signature = sign(&new_tbs)?;
    let mut bits = vec![0u8];
    bits.extend(signature);
    let mut cert = new_tbs;
    cert.extend_from_slice(sig_alg);
    cert.extend(tlv(TAG_BIT_STRING, &bits));
    Ok(tlv(TAG_SEQUENCE, &cert))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lengths_round_trip() {
        let payload = vec![7u8; 300];
        let enc = tlv(TAG_SEQUENCE, &payload);
        assert_eq!(&enc[..4], &[0x30, 0x82, 0x01, 0x2c]);
        assert_eq!(content(&enc).unwrap(), payload.as_slice());
        assert!(split_tlv(&enc[..100]).is_err());
    }

    #[test]
    fn name_has_one_rdn_per_group() {
        let name = encode_name("bob", &["a".into(), "b".into()]);
        assert_eq!(children(&name).unwrap().len(), 3);
    }
}
