"""The reply grammar `<action>WORD</action>`: replies constrained to exactly one valid action.

With the grammar on, a reply is `prefix + [word] + suffix + [end of turn]`: the prefix (the tokens of
`<action>`), the suffix (`</action>`) and the end-of-turn token are forced, and only the word is
chosen, from the five action words. So a turn costs one forward pass, a reply can never be
unparsable, and the policy's distribution is a softmax over five logits. The sampler and the
trainer's log-probabilities apply the same restriction (`word_ids`), so on-policy ratios are 1;
forced tokens have probability 1 and carry no loss.

Each action word must be one token in the model's vocabulary (true for the tiny tokenizer and for
Qwen's); the prefix and suffix may be several.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..envs.actions import ACTIONS
from ..errors import UserError

GRAMMARS = ("free", "action")


class GrammarError(UserError, ValueError):
    """The tokenizer cannot express the reply grammar."""


@dataclass(frozen=True)
class ActionGrammar:
    prefix: tuple[int, ...]  # tokens of "<action>"
    word_ids: tuple[int, ...]  # one token per action, in ACTIONS order
    suffix: tuple[int, ...]  # tokens of "</action>"
    end_id: int  # end of turn

    @classmethod
    def from_chat(cls, chat) -> "ActionGrammar":
        words = []
        for word in ACTIONS:
            ids = chat.text(word)
            if len(ids) != 1:
                raise GrammarError(
                    f"reply_grammar 'action' needs each action word to be one token; {word!r} is {len(ids)} tokens "
                    f"in this tokenizer: use reply_grammar 'free'"
                )
            words.append(ids[0])
        return cls(prefix=tuple(chat.text("<action>")), word_ids=tuple(words), suffix=tuple(chat.text("</action>")),
                   end_id=chat.im_end)

    def reply(self, action_index: int) -> list[int]:
        return [*self.prefix, self.word_ids[action_index], *self.suffix, self.end_id]

    def forced(self) -> list[bool]:
        """Per reply token: True where the grammar fixes it (everything but the word)."""
        return [True] * len(self.prefix) + [False] + [True] * (len(self.suffix) + 1)

    def word_index(self, action: str) -> int:
        return ACTIONS.index(action)
