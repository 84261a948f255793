(function () {
  var details = document.getElementById('details');
  var pinned = null;
  function show(cell) { details.textContent = cell.title; }
  function light(cell, on) {
    var table = cell.closest('table');
    var col = table.querySelector('th.col[data-col="' + cell.dataset.col + '"]');
    if (col) { col.classList.toggle('hl', on); }
  }
  document.querySelectorAll('table.matrix td[data-outcome]').forEach(function (cell) {
    cell.addEventListener('mouseenter', function () {
      light(cell, true);
      if (!pinned) { show(cell); }
    });
    cell.addEventListener('mouseleave', function () { light(cell, false); });
    cell.addEventListener('click', function () {
      pinned = pinned === cell ? null : cell;
      details.classList.toggle('pinned', pinned !== null);
      show(cell);
    });
  });
  document.querySelectorAll('.legend [data-count-for]').forEach(function (span) {
    var n = document.querySelectorAll(
      'table.matrix td[data-outcome="' + span.dataset.countFor + '"]').length;
    span.textContent = '(' + n + ')';
  });
  document.body.dataset.ready = 'yes';
})();
