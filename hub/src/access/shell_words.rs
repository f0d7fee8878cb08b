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

/// One word and how it was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Word {
    /// The word after quote removal.
    pub text: String,
    /// Whether the word was exactly one quoted string (`'…'` or `"…"`), with nothing
    /// unquoted or escaped around it.
    pub whole_quoted: bool,
}

/// Splits `input` into words following the rules in the module documentation.
pub fn split(input: &str) -> Result<Vec<String>, ShellWordsError> {
    Ok(split_words(input)?.into_iter().map(|w| w.text).collect())
}

/// [`split`], also telling for each word whether it was one quoted string.
pub fn split_words(input: &str) -> Result<Vec<Word>, ShellWordsError> {
    let mut words = Vec::new();
    let mut current = String::new();
    // `in_word` distinguishes "no word yet" from "an empty quoted word".
    let mut in_word = false;
    // Quoted strings and unquoted pieces (characters, escapes) of the current word.
    let (mut quoted, mut unquoted) = (0usize, false);
    let mut chars = input.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' | '\n' => {
                if in_word {
                    words.push(Word {
                        text: std::mem::take(&mut current),
                        whole_quoted: quoted == 1 && !unquoted,
                    });
                    in_word = false;
                }
                (quoted, unquoted) = (0, false);
            }
            '\'' => {
                in_word = true;
                quoted += 1;
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
                quoted += 1;
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
                    unquoted = true;
                    current.push(ch);
                }
                None => return Err(ShellWordsError::TrailingBackslash),
            },
            ch => {
                in_word = true;
                unquoted = true;
                current.push(ch);
            }
        }
    }
    if in_word {
        words.push(Word {
            text: current,
            whole_quoted: quoted == 1 && !unquoted,
        });
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
    fn tells_which_words_were_one_quoted_string() {
        let kinds: Vec<(String, bool)> = split_words(r#"'a b' "c d" e\ f 'g'h "" i'j' k"#)
            .unwrap()
            .into_iter()
            .map(|w| (w.text, w.whole_quoted))
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("a b".to_string(), true),
                ("c d".to_string(), true),
                ("e f".to_string(), false),
                ("gh".to_string(), false),
                ("".to_string(), true),
                ("ij".to_string(), false),
                ("k".to_string(), false),
            ]
        );
    }

    #[test]
    fn empty_input_is_no_words() {
        assert!(split("   ").unwrap().is_empty());
    }
}
