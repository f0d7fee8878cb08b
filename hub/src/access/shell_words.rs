//! POSIX-shell-style word splitting for the `--clusterprofile-access-provider` flag value.
//!
//! Supported syntax (a subset of `sh`, no expansion of any kind):
//! - words are separated by unquoted spaces, tabs or newlines;
//! - `'single quotes'` keep everything literally up to the next `'`;
//! - `"double quotes"` keep everything literally except `\"`, `\\`, `` \` `` and `\$`,
//!   which lose their backslash;
//! - outside quotes, a backslash escapes the next character;
//! - `''` or `""` produce an empty word.
//!
//! No variable, glob, tilde or command expansion happens: `$HOME` stays `$HOME`.

use thiserror::Error;

/// Why a flag value could not be split into words.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ShellWordsError {
    /// A quote was opened and never closed.
    #[error("unterminated {0} quote")]
    UnterminatedQuote(&'static str),
    /// The value ends with a lone backslash.
    #[error("trailing backslash")]
    TrailingBackslash,
}

/// Splits `input` into words following the rules in the module documentation.
pub fn split(input: &str) -> Result<Vec<String>, ShellWordsError> {
    let mut words = Vec::new();
    let mut current = String::new();
    // `in_word` distinguishes "no word yet" from "an empty quoted word".
    let mut in_word = false;
    let mut chars = input.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' | '\n' => {
                if in_word {
                    words.push(std::mem::take(&mut current));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(ch) => current.push(ch),
                        None => return Err(ShellWordsError::UnterminatedQuote("single")),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(ch @ ('"' | '\\' | '`' | '$')) => current.push(ch),
                            Some('\n') => {}
                            Some(ch) => {
                                current.push('\\');
                                current.push(ch);
                            }
                            None => return Err(ShellWordsError::UnterminatedQuote("double")),
                        },
                        Some(ch) => current.push(ch),
                        None => return Err(ShellWordsError::UnterminatedQuote("double")),
                    }
                }
            }
            '\\' => match chars.next() {
                Some('\n') => {}
                Some(ch) => {
                    in_word = true;
                    current.push(ch);
                }
                None => return Err(ShellWordsError::TrailingBackslash),
            },
            ch => {
                in_word = true;
                current.push(ch);
            }
        }
    }
    if in_word {
        words.push(current);
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_plain_words_and_collapses_whitespace() {
        assert_eq!(split("  a  b\tc\n").unwrap(), vec!["a", "b", "c"]);
    }

    #[test]
    fn honours_quotes_and_escapes() {
        assert_eq!(
            split(r#"/bin/p --a 'x y' "q \"z\" \$HOME" w\ v '' e"#).unwrap(),
            vec!["/bin/p", "--a", "x y", "q \"z\" $HOME", "w v", "", "e"]
        );
        assert_eq!(split(r#""a\nb""#).unwrap(), vec![r"a\nb"]);
        assert_eq!(split("pre'mid'post").unwrap(), vec!["premidpost"]);
    }

    #[test]
    fn rejects_unterminated_input() {
        assert_eq!(
            split("'abc"),
            Err(ShellWordsError::UnterminatedQuote("single"))
        );
        assert_eq!(
            split("\"abc"),
            Err(ShellWordsError::UnterminatedQuote("double"))
        );
        assert_eq!(split("abc\\"), Err(ShellWordsError::TrailingBackslash));
    }

    #[test]
    fn empty_input_is_no_words() {
        assert!(split("   ").unwrap().is_empty());
    }
}
