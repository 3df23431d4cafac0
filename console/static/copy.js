// Copy buttons: every element marked data-copy gets a "Copy" button after it that puts the
// element's text on the clipboard. Without JavaScript the text is there to select by hand.
(function () {
  "use strict";
  if (!navigator.clipboard) {
    return;
  }
  document.querySelectorAll("[data-copy]").forEach(function (source) {
    var button = document.createElement("button");
    button.type = "button";
    button.className = "copy";
    button.textContent = "Copy";
    button.setAttribute("aria-label", "Copy " + source.getAttribute("data-copy"));
    button.addEventListener("click", function () {
      navigator.clipboard.writeText(source.textContent.trim()).then(function () {
        button.textContent = "Copied";
        setTimeout(function () { button.textContent = "Copy"; }, 2000);
      });
    });
    source.insertAdjacentElement("afterend", button);
  });
})();
