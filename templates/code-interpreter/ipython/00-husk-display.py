# husk's IPython startup file for the code-interpreter template (installed into
# /usr/local/etc/ipython/startup/, which IPython runs for every profile and every user).
#
# In a Jupyter kernel it adds two display formats the E2B code-interpreter SDKs read:
#   e2b/data   pandas DataFrames as {"column": [values...]} (JSON-safe), next to pandas' own
#              text/html and text/plain, which are left alone;
#   e2b/chart  matplotlib figures described as data by the `e2b_charts` package (if it is
#              installed and understands the figure), next to the inline backend's image/png.
# It also makes matplotlib's inline backend the default, so `plt.show()` or a figure as a cell's
# last expression yields image/png display data, and displays the PIL images a cell saves to a
# path or shows, as E2B's interpreter does.
#
# Nothing is imported eagerly: the formatters match classes by module and class name and only
# run once pandas or matplotlib is in use, and PIL is patched by an import hook when something
# first imports it, so kernel start-up stays fast. Everything lives inside
# one function that deletes itself, so the user's namespace gains no names.


def _husk_setup_display():
    import math
    import os

    # ipykernel sets this too when nothing else has; being explicit keeps the contract in one
    # place (a value the user or the template's env gives wins).
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")

    try:
        from IPython import get_ipython
        from IPython.core.formatters import BaseFormatter
        from traitlets import ObjectName, Unicode
    except ImportError:
        return
    shell = get_ipython()
    # Only kernels (ipykernel's shell has a `kernel`); a terminal `ipython` is left as it is.
    if shell is None or getattr(shell, "kernel", None) is None:
        return

    def jsonable(value):
        """A JSON value for one cell of a DataFrame: numbers, strings, booleans and None as
        themselves (NaN and infinities as None), timestamps as ISO 8601, anything else as str."""
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, int):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else None
        # numpy scalars that tolist() left behind, pandas' NA/NaT, and other number types.
        item = getattr(value, "item", None)
        if callable(item):
            try:
                v = item()
            except Exception:
                v = value
            if v is not value and not hasattr(v, "item"):
                return jsonable(v)
        try:
            import pandas

            if value is pandas.NaT or value is pandas.NA:
                return None
        except ImportError:
            pass
        isoformat = getattr(value, "isoformat", None)
        if callable(isoformat):
            try:
                return isoformat()
            except Exception:
                pass
        if isinstance(value, (list, tuple)):
            return [jsonable(v) for v in value]
        if isinstance(value, dict):
            return {str(k): jsonable(v) for k, v in value.items()}
        return str(value)

    def dataframe_data(df):
        """{column name: [values]} like DataFrame.to_dict(orient="list"), but JSON-safe."""
        try:
            return {
                str(name): [jsonable(v) for v in df[name].tolist()]
                if not hasattr(df[name], "columns")  # a duplicated column name gives a frame
                else [jsonable(v) for v in df[name].iloc[:, 0].tolist()]
                for name in df.columns
            }
        except Exception:
            return None  # never a traceback in the user's output for an extra format

    def figure_chart(figure):
        try:
            from e2b_charts import chart_figure_to_dict
        except ImportError:
            return None
        try:
            chart = chart_figure_to_dict(figure)
        except Exception:
            return None
        return chart or None

    class ByClassName(BaseFormatter):
        """A formatter for classes named by module and name, looked up along the object's MRO
        at every call. IPython's own `for_type_by_name` is not used: enabling matplotlib's
        inline backend drops every formatter's entry for Figure (pylabtools'
        select_figure_formats), which would silently undo the chart format."""

        targets = {}

        def __call__(self, obj):
            if self.enabled:
                for cls in type(obj).__mro__:
                    func = self.targets.get((getattr(cls, "__module__", None), cls.__name__))
                    if func is not None:
                        return func(obj)
            return super().__call__(obj)

    class HuskDataFormatter(ByClassName):
        format_type = Unicode("e2b/data")
        print_method = ObjectName("_repr_e2b_data_")
        _return_type = (dict, list)
        # pandas 3 names its classes' module `pandas`; older releases `pandas.core.frame`.
        targets = {("pandas", "DataFrame"): dataframe_data, ("pandas.core.frame", "DataFrame"): dataframe_data}

    class HuskChartFormatter(ByClassName):
        format_type = Unicode("e2b/chart")
        print_method = ObjectName("_repr_e2b_chart_")
        _return_type = (dict,)
        targets = {("matplotlib.figure", "Figure"): figure_chart}

    display = shell.display_formatter
    for cls in (HuskDataFormatter, HuskChartFormatter):
        formatter = cls(parent=display)
        display.formatters[formatter.format_type] = formatter

    # PIL images a cell saves to a path, or shows, are displayed too (as E2B's interpreter
    # does): `Image.save("x.png")` writes the file and gives an image/png result; `show()`
    # displays instead of looking for a desktop viewer. PIL is patched when a cell first
    # imports it, by a one-shot import hook, so kernels that never use it never load it.
    import importlib.abc
    import importlib.util
    import sys

    def patch_pil(image_module):
        from IPython.display import display as show_in_cell

        original_save = image_module.Image.save

        def save(self, fp, format=None, **params):
            result = original_save(self, fp, format, **params)
            if isinstance(fp, (str, bytes, os.PathLike)):
                try:
                    show_in_cell(self)
                except Exception:
                    pass  # never a traceback in the user's output for an extra result
            return result

        def show(self, title=None):
            show_in_cell(self)

        save.__doc__ = original_save.__doc__
        image_module.Image.save = save
        image_module.Image.show = show

    class PilHook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "PIL.Image":
                return None
            sys.meta_path.remove(self)  # once: find the real module, then step aside
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def exec_and_patch(module):
                exec_module(module)
                try:
                    patch_pil(module)
                except Exception:
                    pass

            spec.loader.exec_module = exec_and_patch
            return spec

    if "PIL.Image" in sys.modules:
        patch_pil(sys.modules["PIL.Image"])
    else:
        sys.meta_path.insert(0, PilHook())


try:
    _husk_setup_display()
finally:
    del _husk_setup_display
