"""The command line, ``python -m zerotir``: the LightningCLI (``app``), its errors (``errors``), the key index and
value checks answered before torch loads (``keys``, ``keys.json``, ``values``), the checks Lightning answers late
(``checks``) and what a person sees (``console``). Nothing is imported here, so ``keys`` stays light."""
