"""The hooks a callback may implement, and the ordered list that calls them.

Per launch: `pre_train` once before the first step; per step `post_train_batch` (the step's
figures, still inside the step's timed wall) then `post_step` (after the step's time is taken);
`post_checkpoint_saved` whenever a callback saves; `on_error` when a step raises (it raises on);
`post_train` once after the last step; `close` always, last (also after an error).
"""

from __future__ import annotations

from titanlite.trainer.train_step import StepOutput


class Callback:
    def pre_train(self) -> None:
        pass

    def post_train_batch(
        self, step: int, out: StepOutput, validation: dict[str, float] | None
    ) -> None:
        pass

    def post_step(self, step: int) -> None:
        pass

    def post_checkpoint_saved(self, step: int) -> None:
        pass

    def on_error(self, step: int, error: BaseException) -> None:
        pass

    def post_train(self) -> None:
        pass

    def close(self) -> None:
        pass


class Callbacks(list[Callback]):
    """Each hook called on every callback, in the list's order."""

    def pre_train(self) -> None:
        for callback in self:
            callback.pre_train()

    def post_train_batch(
        self, step: int, out: StepOutput, validation: dict[str, float] | None
    ) -> None:
        for callback in self:
            callback.post_train_batch(step, out, validation)

    def post_step(self, step: int) -> None:
        for callback in self:
            callback.post_step(step)

    def post_checkpoint_saved(self, step: int) -> None:
        for callback in self:
            callback.post_checkpoint_saved(step)

    def on_error(self, step: int, error: BaseException) -> None:
        for callback in self:
            callback.on_error(step, error)

    def post_train(self) -> None:
        for callback in self:
            callback.post_train()

    def close(self) -> None:
        for callback in self:
            callback.close()
