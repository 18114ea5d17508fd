"""Which trajectories of a step leave the loss, as pure functions of the scored trajectories: the blocks of a response
(``blocks``), the rules that judge one trajectory (``trajectory``), the overlong handling (``overlong``), the
correct-with-errors downsampling (``roc``) and their composition with the pass-rate decision (``decide``)."""
