// Draws the report's charts from the JSON in #report-data with ECharts (SVG renderer). Any
// error lands in #errors, so a test (or a reader) sees it.
(function () {
  'use strict';
  var errors = document.getElementById('errors');
  function fail(msg) {
    errors.hidden = false;
    errors.textContent += msg + '\n';
  }
  window.addEventListener('error', function (e) { fail('error: ' + e.message); });
  var data;
  try {
    data = JSON.parse(document.getElementById('report-data').textContent);
  } catch (e) {
    fail('the report data cannot be read: ' + e);
    return;
  }
  var palette = ['#0072b2', '#e69f00', '#009e73', '#d55e00', '#cc79a7', '#56b4e9', '#f0e442', '#000000'];
  var base = { animation: false, color: palette, textStyle: { fontFamily: 'system-ui, sans-serif' } };
  function fmtBytes(b) {
    var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], i = 0;
    while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
    return (i === 0 ? b : b.toFixed(b < 10 ? 1 : 0)) + ' ' + u[i];
  }
  function empty(el, text) {
    el.innerHTML = '<div class="empty">' + text + '</div>';
    el.style.height = 'auto';
    el.dataset.drawn = 'empty';
  }
  function draw(el, option) {
    var chart = echarts.init(el, null, { renderer: 'svg' });
    var o = Object.assign({}, base, option);
    chart.setOption(o);
    el.dataset.drawn = 'chart';
    window.addEventListener('resize', function () { chart.resize(); });
  }
  var charts = {
    timeline: function (el, job) {
      var f = job.findings[+el.dataset.finding];
      var t = f && f.timeline;
      if (!t || !t.calls.length) { return empty(el, 'No call of these ranks near this finding.'); }
      draw(el, {
        grid: { left: 80, right: 20, top: 20, bottom: 40 },
        tooltip: { formatter: function (p) {
          var v = p.value; return t.rows[v[0]] + ': ' + v[3] + '<br>' + v[1].toFixed(3) + ' – ' + v[2].toFixed(3) + ' s';
        } },
        xAxis: { type: 'value', min: t.from_s, max: t.to_s, name: 's', nameLocation: 'end',
                 axisLabel: { formatter: function (v) { return +v.toPrecision(4); } } },
        yAxis: { type: 'category', data: t.rows, inverse: true },
        series: [{
          type: 'custom',
          renderItem: function (params, api) {
            var row = api.value(0), a = api.coord([api.value(1), row]), b = api.coord([api.value(2), row]);
            var h = api.size([0, 1])[1] * 0.6;
            var open = api.value(4);
            return { type: 'rect', shape: { x: a[0], y: a[1] - h / 2, width: Math.max(b[0] - a[0], 1.5), height: h },
                     style: { fill: open ? '#d55e00' : '#0072b2', opacity: open ? 0.85 : 0.7 } };
          },
          encode: { x: [1, 2], y: 0 },
          data: t.calls
        }, {
          type: 'line', data: [], markLine: { silent: true, symbol: 'none', label: { formatter: 'opened' },
            lineStyle: { color: '#d55e00', type: 'dashed' }, data: [{ xAxis: f.opened_s }] }
        }]
      });
    },
    heatmap: function (el, job) {
      var h = job.heatmap;
      if (!h.cells.length) { return empty(el, 'No collective had two members in this trace.'); }
      var cols = [];
      for (var i = 0; i < 120; i++) { cols.push((i * h.bin_s).toFixed(h.bin_s < 1 ? 2 : 0)); }
      draw(el, {
        grid: { left: 110, right: 30, top: 10, bottom: 90 },
        tooltip: { formatter: function (p) { return h.rows[p.value[1]] + ', ' + cols[p.value[0]] + ' s: ' + p.value[2].toFixed(2) + ' ms late'; } },
        xAxis: { type: 'category', data: cols, name: 's', splitArea: { show: false } },
        yAxis: { type: 'category', data: h.rows, inverse: true },
        visualMap: { min: 0, max: Math.max(h.max_ms, 0.001), calculable: true, orient: 'horizontal', left: 'center', bottom: 5,
                     inRange: { color: ['#fde725', '#5ec962', '#21918c', '#3b528b', '#440154'] }, text: ['ms late', ''] },
        series: [{ type: 'heatmap', data: h.cells }]
      });
    },
    progress: function (el, job) {
      if (!job.progress.length) { return empty(el, 'No collective completed in this trace.'); }
      var series = [];
      job.progress.forEach(function (p) {
        var label = p.name ? p.comm + ' (' + p.name + ')' : p.comm;
        series.push({ type: 'line', name: label + ' most', showSymbol: false, data: p.points.map(function (x) { return [x[0], x[2]]; }) });
        series.push({ type: 'line', name: label + ' fewest', showSymbol: false, lineStyle: { type: 'dashed' },
                      data: p.points.map(function (x) { return [x[0], x[1]]; }) });
      });
      draw(el, {
        grid: { left: 70, right: 20, top: 50, bottom: 40 },
        legend: { type: 'scroll', top: 0 },
        tooltip: { trigger: 'axis' },
        xAxis: { type: 'value', name: 's' },
        yAxis: { type: 'value', name: 'completed', scale: true },
        series: series
      });
    },
    durations: function (el, job) {
      if (!job.durations.length) { return empty(el, 'No completed call in this trace.'); }
      var series = job.durations.map(function (d) {
        return { type: 'bar', name: d.op, barGap: 0,
                 data: d.bins.map(function (b) { return [Math.sqrt(b[0] * b[1]), b[2]]; }) };
      });
      draw(el, {
        grid: { left: 70, right: 20, top: 40, bottom: 45 },
        legend: { top: 0 },
        tooltip: { trigger: 'item', formatter: function (p) { return p.seriesName + ': ' + p.value[1] + ' calls near ' + p.value[0].toFixed(0) + ' µs'; } },
        xAxis: { type: 'log', name: 'µs', nameLocation: 'middle', nameGap: 28 },
        yAxis: { type: 'value', name: 'calls' },
        series: series
      });
    },
    busbw: function (el, job) {
      if (!job.busbw.length) { return empty(el, 'No call carried a size and a duration.'); }
      draw(el, {
        grid: { left: 70, right: 20, top: 40, bottom: 45 },
        legend: { top: 0 },
        tooltip: { formatter: function (p) { return p.seriesName + ' ' + fmtBytes(p.value[0]) + ': ' + p.value[1].toFixed(2) + ' GB/s (' + p.value[2] + ' calls)'; } },
        xAxis: { type: 'log', name: 'bytes', nameLocation: 'middle', nameGap: 28, axisLabel: { formatter: fmtBytes } },
        yAxis: { type: 'value', name: 'GB/s' },
        series: job.busbw.map(function (b) {
          return { type: 'line', name: b.op, symbolSize: 6, data: b.points };
        })
      });
    },
    links: function (el, job) {
      if (!job.links.length) { return empty(el, 'No per-link records (NCCL profiler plugin) in this trace.'); }
      var rows = job.links.slice(0, 30);
      draw(el, {
        grid: { left: 200, right: 40, top: 20, bottom: 40 },
        tooltip: {},
        xAxis: { type: 'value', name: 'GB/s per channel' },
        yAxis: { type: 'category', inverse: true, data: rows.map(function (l) { return l.src + ' → ' + l.dst; }) },
        series: [{ type: 'bar', data: rows.map(function (l) { return l.rate_gbs; }) }]
      });
    },
    whatif: function (el, job) {
      var w = job.whatif;
      if (!w.ranks.length) { return empty(el, 'No rank kept the others waiting for 1 % of the time or more.'); }
      draw(el, {
        grid: { left: 90, right: 40, top: 20, bottom: 40 },
        tooltip: { formatter: function (p) { return 'without rank ' + w.ranks[p.dataIndex][0] + "'s delay: −" + p.value.toFixed(1) + ' % of wall time'; } },
        xAxis: { type: 'value', name: '% of wall time', max: 100 },
        yAxis: { type: 'category', inverse: true, data: w.ranks.map(function (r) { return 'rank ' + r[0]; }) },
        series: [{ type: 'bar', data: w.ranks.map(function (r) { return r[2] * 100; }) }]
      });
    }
  };
  var els = document.querySelectorAll('.chart');
  for (var i = 0; i < els.length; i++) {
    var el = els[i];
    var job = data.jobs[+el.dataset.job];
    var kind = Object.keys(charts).find(function (k) { return el.classList.contains(k); });
    try {
      charts[kind](el, job);
    } catch (e) {
      fail(kind + ' chart: ' + e);
    }
  }
  document.body.dataset.charts = String(document.querySelectorAll('.chart[data-drawn="chart"]').length);
})();
